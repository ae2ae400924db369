/** @module Fast non-cryptographic hashing for KV block chains and seeded pseudo-randomness. */

const TWO_32 = 4294967296;

/** Murmur3's 32-bit finaliser. */
export function fmix32(h: number): number {
  let x = h | 0;
  x ^= x >>> 16;
  x = Math.imul(x, 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  x ^= x >>> 16;
  return x >>> 0;
}

/**
 * Hash of `tokens[start, end)` chained onto `parent` (the previous block's
 * hash, 0 for the first block), as a 53-bit integer so it is a cheap `Map`
 * key. Equal hashes mean equal token prefixes, up to collisions (2^-53 per
 * pair: negligible for the block counts simulated).
 */
export function hashTokens(parent: number, tokens: ArrayLike<number>, start: number, end: number): number {
  let h1 = ((parent % TWO_32) ^ 0x9e3779b9) | 0;
  let h2 = (Math.floor(parent / TWO_32) ^ 0x7f4a7c15) | 0;
  for (let i = start; i < end; i++) {
    const k = tokens[i]! | 0;
    h1 = Math.imul(h1 ^ k, 0xcc9e2d51);
    h1 = (h1 << 15) | (h1 >>> 17);
    h1 = (Math.imul(h1, 5) + 0xe6546b64) | 0;
    h2 = Math.imul(h2 ^ k, 0x1b873593);
    h2 = (h2 << 13) | (h2 >>> 19);
    h2 = (h2 + h1) | 0;
  }
  const a = fmix32(h1 ^ (end - start));
  const b = fmix32(h2 ^ a);
  return (b >>> 11) * TWO_32 + a;
}

/** Mixes numbers (each an integer up to 2^53) into one 32-bit seed. */
export function mixSeed(...values: number[]): number {
  let h = 0x811c9dc5;
  for (const value of values) {
    h = fmix32(h ^ (value % TWO_32));
    h = fmix32(h ^ Math.floor(value / TWO_32));
  }
  return h >>> 0;
}

/** 32-bit seed of a string (FNV-1a, then the murmur finaliser). */
export function stringSeed(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return fmix32(h);
}

/** One step of xorshift32 on a non-zero state; returns the next state (also the output). */
export function xorshift32(state: number): number {
  let x = state | 0;
  x ^= x << 13;
  x ^= x >>> 17;
  x ^= x << 5;
  return x >>> 0;
}
