/**
 * @module The storage of the fleet prefix index (`fleet-prefix-index.ts`, docs/routing.md): tree
 * nodes keyed by (chained block hash, parent), (block, replica) entries threaded through each
 * node's holder list and each replica's tiered LRU (`tiered-lru.ts`), the replica slots and the
 * interned non-hex hashes, with the operations that keep them consistent (add, evict, trim).
 *
 * Struct-of-arrays in typed arrays with two open-addressing tables (`id-table.ts`), so an entry
 * costs a few dozen bytes and no JS object. The walks that answer queries live in the index.
 */

import { IdTable, NONE } from "./id-table.js";
import { TieredLru } from "./tiered-lru.js";

/** Parent id of a first block. */
export const ROOT = -1;
/** Bytes per node: hash low, hash high, parent and kind, holder head, holder count (Int32). */
export const NODE_BYTES = 5 * 4;
/** Bytes per entry: node, replica, holder prev/next, LRU prev/next (Int32), children (Uint16), tier (Uint8). */
export const ENTRY_BYTES = 6 * 4 + 2 + 1;
/** A child count at or above this lives in `manyChildren`. */
export const MANY = 0xffff;

/** Hex digit values of lowercase `0-9a-f`, −1 elsewhere (the form `blockHashes` renders). */
export const HEX_VALUE = (() => {
  const table = new Int8Array(128).fill(-1);
  for (let i = 0; i < 16; i++) table["0123456789abcdef".charCodeAt(i)] = i;
  return table;
})();

/** A node's parent and key kind in one word: (parent + 1) · 2 + kind. */
export function parentKey(parent: number, kind: number): number {
  return (parent + 1) * 2 + kind;
}

function grownInt32(old: Int32Array<ArrayBuffer>, length: number): Int32Array<ArrayBuffer> {
  const next = new Int32Array(length);
  next.set(old);
  return next;
}

/**
 * Nodes, entries, holder lists, replica slots and interned keys of the fleet prefix index, and the
 * operations that keep their invariants (see `FleetPrefixIndex`). Extended by the index, which
 * adds the walks; the fields are shared with it, not a public surface.
 */
export class FleetPrefixStore {
  // Nodes.
  protected nodeLo = new Int32Array(64);
  protected nodeHi = new Int32Array(64);
  /** Parent and kind (`parentKey`). Kind 0: a rendered 64-bit hash (hi, lo); 1: any other string, interned (hi = intern id). */
  protected nodeParentKey = new Int32Array(64);
  /**
   * First holder entry; for a free node, the next free node. The list runs leaves first, then
   * holders with children; its head's `holderPrev` is its last entry.
   */
  protected nodeHolders = new Int32Array(64);
  protected nodeHolderCount = new Int32Array(64);
  protected readonly nodes = new IdTable(this.nodeLo, this.nodeHi, this.nodeParentKey);
  protected nodeHigh = 0;
  protected nodeFree = NONE;

  // Entries.
  protected entryNode = new Int32Array(64);
  protected entryReplica = new Int32Array(64);
  /** Towards the holder listed before; the list head's is the last holder. */
  protected holderPrev = new Int32Array(64);
  /** Towards the next holder (NONE after the last); for a free entry, the next free entry. */
  protected holderNext = new Int32Array(64);
  /** Children of the entry's node that its replica holds; MANY: see `manyChildren`. */
  protected entryChildren = new Uint16Array(64);
  /** Child counts of MANY or more, by entry. */
  protected readonly manyChildren = new Map<number, number>();
  protected readonly entries = new IdTable(this.entryNode, this.entryReplica);
  protected readonly lru = new TieredLru(64);
  protected entryHigh = 0;
  protected entryFree = NONE;

  // Replicas.
  protected readonly replicaIds = new Map<string, number>();
  protected readonly replicaName: string[] = [];
  protected readonly replicaFree: number[] = [];

  // Hashes that are not 16 lowercase hex digits, interned while a node uses them.
  protected readonly internIds = new Map<string, number>();
  protected readonly internName: string[] = [];
  protected readonly internRefs: number[] = [];
  protected readonly internFree: number[] = [];

  // The key parsed by `parseKey`, kept in fields so a walk allocates nothing.
  protected keyHi = 0;
  protected keyLo = 0;
  protected keyKind = 0;

  // --- keys ---

  /**
   * Parses a hash into the key fields: 16 lowercase hex digits as two 32-bit halves, any other
   * string by its intern id. Returns false when the string is not interned and `intern` is false
   * (then no node can have it).
   */
  protected parseKey(hash: string, intern: boolean): boolean {
    if (hash.length === 16) {
      const hi = hexWord(hash, 0);
      const lo = Number.isNaN(hi) ? hi : hexWord(hash, 8);
      if (!Number.isNaN(lo)) {
        this.keyHi = hi;
        this.keyLo = lo;
        this.keyKind = 0;
        return true;
      }
    }
    let id = this.internIds.get(hash);
    if (id === undefined) {
      if (!intern) return false;
      id = this.internFree.pop() ?? this.internName.length;
      this.internIds.set(hash, id);
      this.internName[id] = hash;
      this.internRefs[id] = 0;
    }
    this.keyHi = id;
    this.keyLo = 0;
    this.keyKind = 1;
    return true;
  }

  // --- nodes ---

  protected parentOf(node: number): number {
    return (this.nodeParentKey[node]! >> 1) - 1;
  }

  /** Adds a node for the parsed key under `parent`. */
  protected addNode(parent: number): number {
    let node = this.nodeFree;
    if (node !== NONE) {
      this.nodeFree = this.nodeHolders[node]!;
    } else {
      if (this.nodeHigh === this.nodeLo.length) this.growNodes();
      node = this.nodeHigh++;
    }
    this.nodeLo[node] = this.keyLo;
    this.nodeHi[node] = this.keyHi;
    this.nodeParentKey[node] = parentKey(parent, this.keyKind);
    this.nodeHolders[node] = NONE;
    this.nodeHolderCount[node] = 0;
    if (this.keyKind === 1) this.internRefs[this.keyHi]!++;
    this.nodes.insert(node);
    return node;
  }

  protected removeNode(node: number): void {
    this.nodes.remove(node);
    if ((this.nodeParentKey[node]! & 1) === 1) {
      const id = this.nodeHi[node]!;
      if (--this.internRefs[id]! === 0) {
        this.internIds.delete(this.internName[id]!);
        this.internName[id] = "";
        this.internFree.push(id);
      }
    }
    this.nodeHolders[node] = this.nodeFree;
    this.nodeFree = node;
  }

  protected growNodes(): void {
    const length = this.grownLength(this.nodeLo.length);
    this.nodeLo = grownInt32(this.nodeLo, length);
    this.nodeHi = grownInt32(this.nodeHi, length);
    this.nodeParentKey = grownInt32(this.nodeParentKey, length);
    this.nodeHolders = grownInt32(this.nodeHolders, length);
    this.nodeHolderCount = grownInt32(this.nodeHolderCount, length);
    this.nodes.keys(this.nodeLo, this.nodeHi, this.nodeParentKey);
  }

  // --- holder lists: leaves first, the head's prev is the last ---

  /** Lists `entry` first among the node's holders (a leaf). */
  protected listFirst(node: number, entry: number): void {
    const head = this.nodeHolders[node]!;
    if (head === NONE) {
      this.holderPrev[entry] = entry;
      this.holderNext[entry] = NONE;
    } else {
      this.holderPrev[entry] = this.holderPrev[head]!;
      this.holderNext[entry] = head;
      this.holderPrev[head] = entry;
    }
    this.nodeHolders[node] = entry;
  }

  /** Lists `entry` last among the node's holders (one with children). */
  protected listLast(node: number, entry: number): void {
    const head = this.nodeHolders[node]!;
    if (head === NONE) {
      this.holderPrev[entry] = entry;
      this.nodeHolders[node] = entry;
    } else {
      const last = this.holderPrev[head]!;
      this.holderNext[last] = entry;
      this.holderPrev[entry] = last;
      this.holderPrev[head] = entry;
    }
    this.holderNext[entry] = NONE;
  }

  protected unlist(node: number, entry: number): void {
    const head = this.nodeHolders[node]!;
    const prev = this.holderPrev[entry]!;
    const next = this.holderNext[entry]!;
    if (entry === head) {
      if (next !== NONE) this.holderPrev[next] = prev;
      this.nodeHolders[node] = next;
    } else {
      this.holderNext[prev] = next;
      if (next !== NONE) this.holderPrev[next] = prev;
      else this.holderPrev[head] = prev;
    }
  }

  protected childCount(entry: number): number {
    const n = this.entryChildren[entry]!;
    return n === MANY ? this.manyChildren.get(entry)! : n;
  }

  /** One more child held under `entry`: a leaf becomes a holder with children, listed last. */
  protected addChild(entry: number): void {
    const n = this.entryChildren[entry]!;
    if (n === MANY) this.manyChildren.set(entry, this.manyChildren.get(entry)! + 1);
    else if (n === MANY - 1) {
      this.entryChildren[entry] = MANY;
      this.manyChildren.set(entry, MANY);
    } else {
      this.entryChildren[entry] = n + 1;
      if (n === 0) {
        const node = this.entryNode[entry]!;
        this.unlist(node, entry);
        this.listLast(node, entry);
      }
    }
  }

  /** One child fewer under `entry`: with none left it is a leaf, listed first. */
  protected removeChild(entry: number): void {
    const n = this.entryChildren[entry]!;
    if (n === MANY) {
      const many = this.manyChildren.get(entry)! - 1;
      if (many < MANY) {
        this.manyChildren.delete(entry);
        this.entryChildren[entry] = many;
      } else this.manyChildren.set(entry, many);
    } else {
      this.entryChildren[entry] = n - 1;
      if (n === 1) {
        const node = this.entryNode[entry]!;
        this.unlist(node, entry);
        this.listFirst(node, entry);
      }
    }
  }

  // --- entries ---

  /**
   * Adds the entry (node, replica), a leaf in the node's holders, not yet in the LRU;
   * `parentEntry` is the replica's entry of the node's parent (NONE for a first block).
   */
  protected addEntry(node: number, replica: number, parentEntry: number): number {
    let entry = this.entryFree;
    if (entry !== NONE) {
      this.entryFree = this.holderNext[entry]!;
    } else {
      if (this.entryHigh === this.entryNode.length) this.growEntries();
      entry = this.entryHigh++;
    }
    this.entryNode[entry] = node;
    this.entryReplica[entry] = replica;
    this.entryChildren[entry] = 0;
    this.listFirst(node, entry);
    this.nodeHolderCount[node]!++;
    if (parentEntry !== NONE) this.addChild(parentEntry);
    this.entries.insert(entry);
    return entry;
  }

  /**
   * Removes an entry entirely — the least recent of its replica, so a leaf: LRU, holders, table,
   * its parent entry's child count; frees its node when it was the last holder.
   */
  protected evict(entry: number, replica: number): void {
    this.lru.remove(entry, replica);
    const node = this.entryNode[entry]!;
    this.unlist(node, entry);
    this.entries.remove(entry);
    const parent = this.parentOf(node);
    if (parent !== ROOT) this.removeChild(this.entries.find(parent, replica));
    this.holderNext[entry] = this.entryFree;
    this.entryFree = entry;
    if (--this.nodeHolderCount[node]! === 0) this.removeNode(node);
  }

  protected growEntries(): void {
    const length = this.grownLength(this.entryNode.length);
    this.entryNode = grownInt32(this.entryNode, length);
    this.entryReplica = grownInt32(this.entryReplica, length);
    this.holderPrev = grownInt32(this.holderPrev, length);
    this.holderNext = grownInt32(this.holderNext, length);
    const children = new Uint16Array(length);
    children.set(this.entryChildren);
    this.entryChildren = children;
    this.lru.grow(length);
    this.entries.keys(this.entryNode, this.entryReplica);
  }

  /**
   * The next length of the node or entry arrays: half as long again, but no longer than the
   * fleet's total capacity (neither can exceed it once trimmed), so a full fleet wastes no room.
   */
  protected grownLength(length: number): number {
    let total = 0;
    for (const r of this.replicaIds.values()) total += this.lru.capacity[r]! + this.lru.hostCapacity[r]!;
    const wanted = Math.ceil(length * 1.5);
    return total > length ? Math.min(wanted, total) : length + Math.max(64, Math.ceil(length / 8));
  }

  // --- replicas ---

  protected replicaSlot(replica: string): number {
    let r = this.replicaIds.get(replica);
    if (r !== undefined) return r;
    r = this.replicaFree.pop() ?? this.replicaName.length;
    this.replicaIds.set(replica, r);
    this.replicaName[r] = replica;
    this.lru.reset(r);
    return r;
  }

  /** Applies the replica's capacities: GPU overflow to host, host overflow forgotten. */
  protected trim(replica: number): void {
    for (let e = this.lru.overflow(replica); e !== NONE; e = this.lru.overflow(replica))
      this.evict(e, replica);
  }
}

/**
 * Eight hex digits of `hash` from `from` as one 32-bit word (signed, as `<<` leaves it), or NaN
}

 */
function hexWord(hash: string, from: number): number {
  let word = 0;
  for (let i = from; i < from + 8; i++) {
    const c = hash.charCodeAt(i);
    const d = c < 128 ? HEX_VALUE[c]! : -1;
    if (d < 0) return Number.NaN;
    word = (word << 4) | d;
  }
  return word;
}
