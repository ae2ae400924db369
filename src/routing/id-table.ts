/**
 * @module An open-addressing hash table of integer ids keyed by two or three 32-bit words that the
 * owner keeps in its own typed arrays, indexed by id (docs/routing.md). The table stores ids only:
 * a lookup compares the words at the probed id with the key, so it allocates nothing and costs
 * 4 bytes per slot. The fleet prefix index uses it twice: nodes by (hash low, hash high, parent),
 * entries by (node, replica).
 */

export const NONE = -1;
/** The table grows past this load (linear probing stays short below it)… */
const MAX_LOAD = 0.7;
/** …to this load: sized to its count, not to powers of two. */
const REHASH_LOAD = 0.5;

function mix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x7feb352d);
  h ^= h >>> 15;
  h = Math.imul(h, 0x846ca68b);
  return h ^ (h >>> 16);
}

function slotHash(a: number, b: number, c: number): number {
  return mix(a ^ mix(b ^ Math.imul(c + 1, 0x9e3779b1))) & 0x7fffffff;
}

/**
 * Ids by key. The key of id `i` is `(a[i], b[i], c[i])`, or `(a[i], b[i])` when built without `c`;
 * the owner sets those words before `insert` and keeps them until `remove`, and hands over its
 * arrays again (`keys`) whenever it reallocates them.
 */
export class IdTable {
  private slots: Int32Array<ArrayBuffer> = new Int32Array(128).fill(NONE);
  private count = 0;
  private a: Int32Array;
  private b: Int32Array;
  private c: Int32Array | null;

  constructor(a: Int32Array, b: Int32Array, c: Int32Array | null = null) {
    this.a = a;
    this.b = b;
    this.c = c;
  }

  /** The owner's key arrays, after it grew them. */
  keys(a: Int32Array, b: Int32Array, c: Int32Array | null = null): void {
    this.a = a;
    this.b = b;
    this.c = c;
  }

  /** Ids held. */
  get size(): number {
    return this.count;
  }

  /** Bytes of the slot array. */
  get bytes(): number {
    return this.slots.byteLength;
  }

  /** The id keyed `(ka, kb, kc)` (`kc` ignored without `c`), or NONE. */
  find(ka: number, kb: number, kc = 0): number {
    const slots = this.slots;
    const size = slots.length;
    const a = this.a;
    const b = this.b;
    const c = this.c;
    for (let i = slotHash(ka, kb, c === null ? 0 : kc) % size; ; i = i + 1 === size ? 0 : i + 1) {
      const id = slots[i]!;
      if (id === NONE) return NONE;
      if (a[id] === ka && b[id] === kb && (c === null || c[id] === kc)) return id;
    }
  }

  /** Adds `id`, whose key words are set and not already in the table. */
  insert(id: number): void {
    if (++this.count > this.slots.length * MAX_LOAD) this.rehash(Math.ceil(this.count / REHASH_LOAD));
    this.place(id);
  }

  /** Removes `id`, which is in the table (its key words still set). */
  remove(id: number): void {
    const slots = this.slots;
    const size = slots.length;
    let i = this.home(id, size);
    while (slots[i] !== id) i = i + 1 === size ? 0 : i + 1;
    // Backward-shift deletion: no tombstones, probes stay as short as the load allows.
    let j = i;
    for (;;) {
      j = j + 1 === size ? 0 : j + 1;
      const other = slots[j]!;
      if (other === NONE) break;
      const home = this.home(other, size);
      if (i <= j ? i < home && home <= j : i < home || home <= j) continue;
      slots[i] = other;
      i = j;
    }
    slots[i] = NONE;
    this.count--;
  }

  /** Every id held, in slot order (for checks). */
  *ids(): Generator<number> {
    for (const id of this.slots) if (id !== NONE) yield id;
  }

  private home(id: number, size: number): number {
    return slotHash(this.a[id]!, this.b[id]!, this.c === null ? 0 : this.c[id]!) % size;
  }

  private place(id: number): void {
    const slots = this.slots;
    const size = slots.length;
    let i = this.home(id, size);
    while (slots[i] !== NONE) i = i + 1 === size ? 0 : i + 1;
    slots[i] = id;
  }

  private rehash(size: number): void {
    const old = this.slots;
    this.slots = new Int32Array(size).fill(NONE);
    for (const id of old) if (id !== NONE) this.place(id);
  }
}
