/**
 * @module Chained block hashes of a token sequence (docs/routing.md): block i's hash covers every token of
 * blocks 0…i, so equal hashes mean equal prefixes, as in vLLM's prefix cache.
 */

// Two independent 32-bit lanes (murmur3-style mixing with distinct constants) give a 64-bit
// block id: collisions among the ~10^6 blocks a fleet holds are then ~10^-7 likely, and the
// whole thing stays in 32-bit integer arithmetic that V8 runs without allocation.

const C1 = 0xcc9e2d51;
const C2 = 0x1b873593;
const C3 = 0x85ebca6b;
const C4 = 0xc2b2ae35;

function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return h ^ (h >>> 16);
}

const HEX = Array.from("0123456789abcdef", (c) => c.charCodeAt(0));

/** Renders two lanes as 16 hex digits; one flat string, ~20× faster than `toString(16)` pairs. */
function render(a: number, b: number): string {
  return String.fromCharCode(
    HEX[(a >>> 28) & 15]!,
    HEX[(a >>> 24) & 15]!,
    HEX[(a >>> 20) & 15]!,
    HEX[(a >>> 16) & 15]!,
    HEX[(a >>> 12) & 15]!,
    HEX[(a >>> 8) & 15]!,
    HEX[(a >>> 4) & 15]!,
    HEX[a & 15]!,
    HEX[(b >>> 28) & 15]!,
    HEX[(b >>> 24) & 15]!,
    HEX[(b >>> 20) & 15]!,
    HEX[(b >>> 16) & 15]!,
    HEX[(b >>> 12) & 15]!,
    HEX[(b >>> 8) & 15]!,
    HEX[(b >>> 4) & 15]!,
    HEX[b & 15]!,
  );
}

function checkBlockSize(blockSize: number): void {
  if (!Number.isInteger(blockSize) || blockSize < 1) {
    throw new RangeError(`blockSize should be a positive integer, got ${blockSize}`);
  }
}

const seedCache = new Map<string, readonly [number, number]>();

/** The chain's starting state for a seed: a separate hash space per seed (per model, per tenant). */
function seedState(seed: string): readonly [number, number] {
  let state = seedCache.get(seed);
  if (state === undefined) {
    let a = 0x9747b28c;
    let b = 0x2545f491;
    for (let i = 0; i < seed.length; i++) {
      const c = seed.charCodeAt(i);
      a = Math.imul(a ^ c, 0x01000193);
      b = Math.imul(b ^ c, 0x5bd1e995);
    }
    state = [fmix32(a ^ seed.length), fmix32(b + seed.length)];
    if (seedCache.size < 1024) seedCache.set(seed, state);
  }
  return state;
}

/** Parses a rendered block hash back into its two lanes (the parent state of the next block). */
function parseHash(hash: string): [number, number] {
  return [Number.parseInt(hash.slice(0, 8), 16) | 0, Number.parseInt(hash.slice(8, 16), 16) | 0];
}

/**
 * Hashes `blocks` blocks of `tokens` starting at index `start`, chaining from the parent lanes,
 * writing each block's two lanes to `lanes` from index `at` on. The parent of block i is block
 * i−1's hash, so a chain resumes from any block's lanes.
 */
function hashBlockLanes(
  tokens: ArrayLike<number>,
  start: number,
  blockSize: number,
  blocks: number,
  parentA: number,
  parentB: number,
  lanes: Int32Array,
  at: number,
): void {
  let a = parentA;
  let b = parentB;
  for (let block = 0; block < blocks; block++) {
    const begin = start + block * blockSize;
    const end = begin + blockSize;
    for (let i = begin; i < end; i++) {
      const t = tokens[i]!;
      let k = Math.imul(t, C1);
      k = (k << 15) | (k >>> 17);
      a ^= Math.imul(k, C2);
      a = (a << 13) | (a >>> 19);
      a = (Math.imul(a, 5) + 0xe6546b64) | 0;
      let j = Math.imul(t, C3);
      j = (j << 17) | (j >>> 15);
      b ^= Math.imul(j, C4);
      b = (b << 11) | (b >>> 21);
      b = (Math.imul(b, 9) + 0x52dce729) | 0;
    }
    a ^= blockSize;
    b ^= blockSize;
    a = (a + b) | 0;
    b = (b + a) | 0;
    a = fmix32(a);
    b = fmix32(b);
    a = (a + b) | 0;
    b = (b + a) | 0;
    lanes[at + 2 * block] = a;
    lanes[at + 2 * block + 1] = b;
  }
}

/** {@link hashBlockLanes} with each block rendered as its hash string, pushed to `out`. */
function hashBlocks(
  tokens: ArrayLike<number>,
  start: number,
  blockSize: number,
  blocks: number,
  parentA: number,
  parentB: number,
  out: string[],
): void {
  const lanes = new Int32Array(2 * blocks);
  hashBlockLanes(tokens, start, blockSize, blocks, parentA, parentB, lanes, 0);
  for (let block = 0; block < blocks; block++) out.push(render(lanes[2 * block]!, lanes[2 * block + 1]!));
}

/** A block's hash string from its two lanes (what {@link blockHashes} returns for that block). */
export function renderBlockHash(a: number, b: number): string {
  return render(a, b);
}

/**
 * The chained hashes of `tokens`' full blocks as lanes, two 32-bit words per block (block i at
 * `2i` and `2i + 1`), continuing the block whose lanes are `parent` (default: the seed's start).
 * The same chain as {@link blockHashes}, without a string per block: for indexes that look most
 * blocks up and find few.
 */
export function blockHashLanes(
  tokens: ArrayLike<number>,
  blockSize: number,
  seed = "",
  parent?: readonly [number, number],
): Int32Array {
  checkBlockSize(blockSize);
  const blocks = Math.floor(tokens.length / blockSize);
  const lanes = new Int32Array(2 * blocks);
  const [a, b] = parent ?? seedState(seed);
  hashBlockLanes(tokens, 0, blockSize, blocks, a, b, lanes, 0);
  return lanes;
}

/**
 * Chained hashes of the full blocks of `tokens` (a trailing partial block is ignored), each
 * rendered as 16 lowercase hex digits. Tokens are integers in [0, 2^32).
 * @param blockSize tokens per block (≥ 1)
 * @param seed separates hash spaces (e.g. per model); default ""
 */
export function blockHashes(tokens: ArrayLike<number>, blockSize: number, seed = ""): string[] {
  checkBlockSize(blockSize);
  const out: string[] = [];
  const [a, b] = seedState(seed);
  hashBlocks(tokens, 0, blockSize, Math.floor(tokens.length / blockSize), a, b, out);
  return out;
}

/**
 * The hashes of a grown prompt, reusing `prevHashes` — the hashes of an earlier prompt that is
 * a prefix of `tokens` — and hashing only the blocks after them. The last reused block is
 * re-hashed as a check; when it differs (the prompt's tail changed) everything is re-hashed.
 * Edits further back are not detected: use {@link blockHashes} when history may be rewritten.
 * @returns a new array; `prevHashes` is not modified
 */
export function blockHashesFrom(
  prevHashes: readonly string[],
  tokens: ArrayLike<number>,
  blockSize: number,
  seed = "",
): string[] {
  checkBlockSize(blockSize);
  const total = Math.floor(tokens.length / blockSize);
  const reuse = Math.min(prevHashes.length, total);
  if (reuse === 0) return blockHashes(tokens, blockSize, seed);
  const [a0, b0] = reuse >= 2 ? parseHash(prevHashes[reuse - 2]!) : seedState(seed);
  const check: string[] = [];
  hashBlocks(tokens, (reuse - 1) * blockSize, blockSize, 1, a0, b0, check);
  if (check[0] !== prevHashes[reuse - 1]) return blockHashes(tokens, blockSize, seed);
  const out = prevHashes.slice(0, reuse);
  const [a, b] = parseHash(out[reuse - 1]!);
  hashBlocks(tokens, reuse * blockSize, blockSize, total - reuse, a, b, out);
  return out;
}

/**
 * The hashes of a sequence whose first `prevHashes.length` full blocks hashed to `prevHashes`,
 * continued by `tail` (every token after those blocks). Equals `blockHashes(head + tail)` without
 * the head's tokens: a finished call extends its prompt's hashes by the prompt's partial last
 * block and its output, never copying the whole context.
 * @returns a new array; `prevHashes` is not modified
 */
export function extendBlockHashes(
  prevHashes: readonly string[],
  tail: ArrayLike<number>,
  blockSize: number,
  seed = "",
): string[] {
  checkBlockSize(blockSize);
  const out = prevHashes.slice();
  const [a, b] = out.length > 0 ? parseHash(out[out.length - 1]!) : seedState(seed);
  hashBlocks(tail, 0, blockSize, Math.floor(tail.length / blockSize), a, b, out);
  return out;
}

/**
 * Streaming form: feed a growing token sequence in pieces; `hashes` always equals
 * `blockHashes(all tokens so far, blockSize, seed)`. Holds only the current partial block.
 */
export class BlockHasher {
  readonly blockSize: number;
  readonly seed: string;
  private readonly out: string[] = [];
  private readonly pending: number[] = [];
  private count = 0;

  constructor(blockSize: number, seed = "") {
    checkBlockSize(blockSize);
    this.blockSize = blockSize;
    this.seed = seed;
  }

  /** Hashes of the full blocks so far (a live view: do not modify). */
  get hashes(): readonly string[] {
    return this.out;
  }

  /** Tokens fed so far, partial block included. */
  get tokenCount(): number {
    return this.count;
  }

  /** Appends tokens; returns the number of new full blocks. */
  extend(tokens: ArrayLike<number>): number {
    const before = this.out.length;
    const bs = this.blockSize;
    let i = 0;
    // Complete the pending partial block first.
    if (this.pending.length > 0) {
      while (i < tokens.length && this.pending.length < bs) this.pending.push(tokens[i++]!);
      if (this.pending.length < bs) {
        this.count += tokens.length;
        return 0;
      }
      this.hashFrom(this.pending, 0, 1);
      this.pending.length = 0;
    }
    const blocks = Math.floor((tokens.length - i) / bs);
    if (blocks > 0) this.hashFrom(tokens, i, blocks);
    for (let j = i + blocks * bs; j < tokens.length; j++) this.pending.push(tokens[j]!);
    this.count += tokens.length;
    return this.out.length - before;
  }

  private hashFrom(tokens: ArrayLike<number>, start: number, blocks: number): void {
    const last = this.out[this.out.length - 1];
    const [a, b] = last === undefined ? seedState(this.seed) : parseHash(last);
    hashBlocks(tokens, start, this.blockSize, blocks, a, b, this.out);
  }
}

/**
 * Number of leading blocks `holds` without a break: a replica can reuse block i only if it also
 * holds blocks 0…i−1, so one that holds blocks 1 and 2 but not 0 scores 0.
 */
export function longestPrefixMatch(hashes: readonly string[], holds: (hash: string) => boolean): number {
  let n = 0;
  while (n < hashes.length && holds(hashes[n]!)) n++;
  return n;
}
