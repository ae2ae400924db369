/**
 * @module One prefix index for the whole fleet (docs/routing.md): a tree of chained block hashes
 * whose nodes list the replicas holding the block, so one walk of a prompt's blocks yields every
 * replica's longest unbroken prefix, whatever the fleet size. Each replica keeps its own LRU of
 * (block, replica) entries, sized to its KV capacity in blocks and cut in a GPU and a host tier
 * (`tiered-lru.ts`), threaded through the same entries.
 *
 * Storage is struct-of-arrays in typed arrays with two open-addressing tables (`id-table.ts`:
 * node by (hash, parent), entry by (node, replica)), so an entry costs a few dozen bytes and no JS
 * object.
 */

import { IdTable, NONE } from "./id-table.js";
import { GPU, TieredLru } from "./tiered-lru.js";

/** Where a replica is predicted to hold a block: GPU memory, or only host memory (loaded back before use). */
export type BlockTier = "gpu" | "host";

const TIER_NAME: readonly BlockTier[] = ["gpu", "host"];

export interface FleetPrefixIndexOptions {
  /**
   * KV capacity of a replica in blocks (an integer ≥ 1, or Infinity for no limit); asked on each
   * record of that replica.
   */
  capacityBlocks: (replica: string) => number;
  /**
   * Host-memory KV capacity of a replica in blocks (an integer ≥ 0, or Infinity); asked on each
   * record of that replica. Default: none (0), one tier.
   */
  hostCapacityBlocks?: (replica: string) => number;
}

/** Sizes of the index, for memory accounting. */
export interface FleetPrefixIndexStats {
  /** Distinct blocks (tree nodes). */
  nodes: number;
  /** (block, replica) pairs held. */
  entries: number;
  replicas: number;
  /** Bytes of the typed arrays, allocated (including room to grow). */
  allocatedBytes: number;
  /** Bytes the arrays would take sized exactly to the live nodes and entries (hash tables as they are). */
  liveBytes: number;
}

/** Parent id of a first block. */
const ROOT = -1;
/** Bytes per node: hash low, hash high, parent and kind, holder head, holder count (Int32). */
const NODE_BYTES = 5 * 4;
/** Bytes per entry: node, replica, holder prev/next, LRU prev/next (Int32), children (Uint16), tier (Uint8). */
const ENTRY_BYTES = 6 * 4 + 2 + 1;
/** A child count at or above this lives in `manyChildren`. */
const MANY = 0xffff;

/** Hex digit values of lowercase `0-9a-f`, −1 elsewhere (the form `blockHashes` renders). */
const HEX_VALUE = (() => {
  const table = new Int8Array(128).fill(-1);
  for (let i = 0; i < 16; i++) table["0123456789abcdef".charCodeAt(i)] = i;
  return table;
})();

/** A node's parent and key kind in one word: (parent + 1) · 2 + kind. */
function parentKey(parent: number, kind: number): number {
  return (parent + 1) * 2 + kind;
}

function checkHostCapacity(replica: string, hostCapacityBlocks: number): number {
  if (
    !(Number.isInteger(hostCapacityBlocks) || hostCapacityBlocks === Number.POSITIVE_INFINITY) ||
    hostCapacityBlocks < 0
  ) {
    throw new RangeError(
      `hostCapacityBlocks of replica "${replica}" should be an integer ≥ 0, got ${hostCapacityBlocks}`,
    );
  }
  return hostCapacityBlocks;
}

function checkCapacity(replica: string, capacityBlocks: number): number {
  if (
    !(Number.isInteger(capacityBlocks) || capacityBlocks === Number.POSITIVE_INFINITY) ||
    capacityBlocks < 1
  ) {
    throw new RangeError(
      `capacityBlocks of replica "${replica}" should be a positive integer, got ${capacityBlocks}`,
    );
  }
  return capacityBlocks;
}

function grownInt32(old: Int32Array<ArrayBuffer>, length: number): Int32Array<ArrayBuffer> {
  const next = new Int32Array(length);
  next.set(old);
  return next;
}

/**
 * Blocks held across the fleet, as a tree keyed by chained block hash. Every `hashes` argument is
 * a chain from the prompt's first block (as `blockHashes` returns): a node is the block together
 * with its whole prefix, so the same hash under another parent is another node.
 *
 * Invariant: a replica that holds a node holds its parent, and the parent is more recent in the
 * replica's LRU (a record touches its chain root first). Evicting from the LRU tail therefore
 * never strands a descendant — the tail is always a leaf of the replica's subtree — and along any
 * path the holder sets only shrink, which is what lets `match` notice where prefixes end by
 * comparing holder counts.
 *
 * Holder lists: each entry counts the children of its node its replica holds, and a node lists
 * its holders with the leaves (no child held) first. Where the walk finds fewer holders than at
 * the parent, the leaves of the parent all stop there; the other holders are checked against
 * the child's only when some of them stop too. So a match costs the blocks walked plus the replicas it returns, in every fleet where
 * prefixes end by eviction (docs/routing.md).
 *
 * Tiers: a replica's LRU list is its GPU entries, then (from `hostHead`) its host entries. A parent
 * being more recent than its child, along any path a replica's blocks are GPU blocks, then host
 * blocks: the longest prefix splits at one depth, found by bisection.
 */
export class FleetPrefixIndex {
  private readonly capacityOf: (replica: string) => number;
  private readonly hostCapacityOf: (replica: string) => number;

  // Nodes.
  private nodeLo = new Int32Array(64);
  private nodeHi = new Int32Array(64);
  /** Parent and kind (`parentKey`). Kind 0: a rendered 64-bit hash (hi, lo); 1: any other string, interned (hi = intern id). */
  private nodeParentKey = new Int32Array(64);
  /**
   * First holder entry; for a free node, the next free node. The list runs leaves first, then
   * holders with children; its head's `holderPrev` is its last entry.
   */
  private nodeHolders = new Int32Array(64);
  private nodeHolderCount = new Int32Array(64);
  private readonly nodes = new IdTable(this.nodeLo, this.nodeHi, this.nodeParentKey);
  private nodeHigh = 0;
  private nodeFree = NONE;

  // Entries.
  private entryNode = new Int32Array(64);
  private entryReplica = new Int32Array(64);
  /** Towards the holder listed before; the list head's is the last holder. */
  private holderPrev = new Int32Array(64);
  /** Towards the next holder (NONE after the last); for a free entry, the next free entry. */
  private holderNext = new Int32Array(64);
  /** Children of the entry's node that its replica holds; MANY: see `manyChildren`. */
  private entryChildren = new Uint16Array(64);
  /** Child counts of MANY or more, by entry. */
  private readonly manyChildren = new Map<number, number>();
  private readonly entries = new IdTable(this.entryNode, this.entryReplica);
  private readonly lru = new TieredLru(64);
  private entryHigh = 0;
  private entryFree = NONE;

  // Replicas.
  private readonly replicaIds = new Map<string, number>();
  private readonly replicaName: string[] = [];
  private readonly replicaFree: number[] = [];

  // Hashes that are not 16 lowercase hex digits, interned while a node uses them.
  private readonly internIds = new Map<string, number>();
  private readonly internName: string[] = [];
  private readonly internRefs: number[] = [];
  private readonly internFree: number[] = [];

  /** Scratch for `stopAt`: per replica slot, the stamp of the last check that saw it hold the child. */
  private stamps = new Int32Array(64);
  private stamp = 0;

  /** Scratch for `match` and `matchReplica`: the nodes of the walked path. */
  private path = new Int32Array(256);

  // The key parsed by `parseKey`, kept in fields so a walk allocates nothing.
  private keyHi = 0;
  private keyLo = 0;
  private keyKind = 0;

  constructor(options: FleetPrefixIndexOptions) {
    this.capacityOf = options.capacityBlocks;
    this.hostCapacityOf = options.hostCapacityBlocks ?? (() => 0);
  }

  /**
   * Records that `replica` now holds the chain `hashes` (a prompt plus its output), making it the
   * most recently used: block 0 most recent, the last block least — a chain is worth something
   * only from its head, so its tail must go first, the order in which vLLM frees a finished
   * request's blocks. The chain is in GPU memory (it was just computed or loaded there). Then the
   * least recently used GPU entries beyond the GPU capacity move to host memory, and those beyond
   * the host capacity are forgotten.
   */
  record(replica: string, hashes: readonly string[]): void {
    const r = this.replicaSlot(replica);
    const lru = this.lru;
    lru.capacity[r] = checkCapacity(replica, this.capacityOf(replica));
    lru.hostCapacity[r] = checkHostCapacity(replica, this.hostCapacityOf(replica));
    let parent = ROOT;
    let cursor = NONE;
    for (let i = 0; i < hashes.length; i++) {
      this.parseKey(hashes[i]!, true);
      let node = this.nodes.find(this.keyLo, this.keyHi, parentKey(parent, this.keyKind));
      if (node === NONE) node = this.addNode(parent);
      let entry = this.entries.find(node, r);
      const fresh = entry === NONE;
      if (fresh) entry = this.addEntry(node, r, cursor);
      lru.touch(entry, r, cursor, fresh);
      cursor = entry;
      parent = node;
    }
    this.trim(r);
  }

  /**
   * Every replica's longest unbroken prefix of `hashes`, in blocks; replicas with none are left
   * out. One walk down the tree: where a node has fewer holders than its parent, the parent's
   * leaf holders stop there, and its other holders are checked against the node's only while
   * some that stop remain unfound (docs/routing.md).
   *
   * With `gpuBlocks`, also sets there, for every replica in the result, how many blocks of its
   * prefix are in GPU memory (the rest only in host memory): a bisection of its prefix, only for
   * replicas that hold host entries at all.
   */
  match(hashes: readonly string[], gpuBlocks?: Map<string, number>): Map<string, number> {
    const result = new Map<string, number>();
    const counts = this.nodeHolderCount;
    if (gpuBlocks !== undefined && this.path.length < hashes.length)
      this.path = new Int32Array(Math.max(hashes.length, this.path.length * 2));
    const path = this.path;
    let parent = ROOT;
    let depth = 0;
    for (; depth < hashes.length; depth++) {
      if (!this.parseKey(hashes[depth]!, false)) break;
      const node = this.nodes.find(this.keyLo, this.keyHi, parentKey(parent, this.keyKind));
      if (node === NONE) break;
      if (gpuBlocks !== undefined) path[depth] = node;
      if (parent !== ROOT) {
        const stopping = counts[parent]! - counts[node]!;
        if (stopping > 0) this.stopAt(parent, node, stopping, depth, result);
      }
      parent = node;
    }
    if (parent !== ROOT) {
      for (let e = this.nodeHolders[parent]!; e !== NONE; e = this.holderNext[e]!) {
        result.set(this.replicaName[this.entryReplica[e]!]!, depth);
      }
    }
    if (gpuBlocks !== undefined) {
      for (const [name, blocks] of result)
        gpuBlocks.set(name, this.gpuDepth(this.replicaIds.get(name)!, blocks));
    }
    return result;
  }

  /**
   * Sets `depth` in `result` for the `stopping` holders of `parent` that do not hold its child
   * `node`: every leaf holder (listed first); then, when some stop that hold other children, the
   * holders of `node` are stamped and the parent's remaining holders checked against the stamps.
   */
  private stopAt(parent: number, node: number, stopping: number, depth: number, result: Map<string, number>) {
    const children = this.entryChildren;
    const next = this.holderNext;
    let left = stopping;
    let e = this.nodeHolders[parent]!;
    for (; e !== NONE && children[e] === 0; e = next[e]!) {
      result.set(this.replicaName[this.entryReplica[e]!]!, depth);
      left--;
    }
    if (left === 0) return;
    // The holders of `node` all have children at `parent`, so they are among those left: a stamp
    // each costs less than probing the entry table for every one of them.
    const stamp = this.nextStamp();
    const stamps = this.stamps;
    for (let h = this.nodeHolders[node]!; h !== NONE; h = next[h]!) stamps[this.entryReplica[h]!] = stamp;
    for (; left > 0 && e !== NONE; e = next[e]!) {
      const r = this.entryReplica[e]!;
      if (stamps[r] !== stamp) {
        result.set(this.replicaName[r]!, depth);
        left--;
      }
    }
  }

  /** A fresh stamp for `stopAt`, the stamp array covering every replica slot. */
  private nextStamp(): number {
    if (this.stamps.length < this.replicaName.length) {
      this.stamps = new Int32Array(Math.max(this.replicaName.length, this.stamps.length * 2));
    }
    if (this.stamp === 0x7fffffff) {
      this.stamps.fill(0);
      this.stamp = 0;
    }
    return ++this.stamp;
  }

  /**
   * One replica's longest unbroken prefix of `hashes`, in blocks (0 when none): a pinned step's
   * check. Walks the path once, then finds where the replica drops off it by bisection — it holds
   * a prefix of any path, so its entries need not be probed block by block. With `tiers`, sets
   * `tiers.gpuBlocks` to how many of those blocks are in GPU memory (the rest only in host memory).
   */
  matchReplica(replica: string, hashes: readonly string[], tiers?: { gpuBlocks: number }): number {
    const r = this.replicaIds.get(replica);
    if (tiers !== undefined) tiers.gpuBlocks = 0;
    if (r === undefined) return 0;
    if (this.path.length < hashes.length)
      this.path = new Int32Array(Math.max(hashes.length, this.path.length * 2));
    const path = this.path;
    let parent = ROOT;
    let depth = 0;
    for (; depth < hashes.length; depth++) {
      if (!this.parseKey(hashes[depth]!, false)) break;
      const node = this.nodes.find(this.keyLo, this.keyHi, parentKey(parent, this.keyKind));
      if (node === NONE) break;
      path[depth] = node;
      parent = node;
    }
    // Invariant: r holds path[0 … lo−1] and not path[hi … depth−1].
    let lo = 0;
    let hi = depth;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.entries.find(path[mid]!, r) !== NONE) lo = mid + 1;
      else hi = mid;
    }
    if (tiers !== undefined) tiers.gpuBlocks = this.gpuDepth(r, lo);
    return lo;
  }

  /** How many of the first `blocks` nodes of `this.path`, all held by `r`, it holds in GPU memory. */
  private gpuDepth(r: number, blocks: number): number {
    if (this.lru.hostHead[r] === NONE) return blocks;
    // Invariant: path[0 … lo−1] are GPU entries of r, path[hi … blocks−1] host entries.
    let lo = 0;
    let hi = blocks;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.lru.tier[this.entries.find(this.path[mid]!, r)] === GPU) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /** Forgets everything `replica` holds (it left, restarted or reset its prefix cache). */
  forget(replica: string): void {
    const r = this.replicaIds.get(replica);
    if (r === undefined) return;
    while (this.lru.tail[r] !== NONE) this.evict(this.lru.tail[r]!, r);
    this.replicaIds.delete(replica);
    this.replicaName[r] = "";
    this.replicaFree.push(r);
  }

  /**
   * Sets a replica's capacities in blocks (it reported its KV capacity, and its host tier's);
   * shrinking moves or evicts its least recently used entries at once. Later records ask
   * `capacityBlocks` and `hostCapacityBlocks` again.
   */
  resize(replica: string, capacityBlocks: number, hostCapacityBlocks = 0): void {
    const max = checkCapacity(replica, capacityBlocks);
    const hostMax = checkHostCapacity(replica, hostCapacityBlocks);
    const r = this.replicaIds.get(replica);
    if (r === undefined) return;
    this.lru.capacity[r] = max;
    this.lru.hostCapacity[r] = hostMax;
    this.trim(r);
  }

  /** Blocks `replica` holds, in both tiers. */
  blocksHeld(replica: string): number {
    const r = this.replicaIds.get(replica);
    return r === undefined ? 0 : this.lru.held[r]!;
  }

  /** Blocks `replica` holds in GPU memory. */
  gpuBlocksHeld(replica: string): number {
    const r = this.replicaIds.get(replica);
    return r === undefined ? 0 : this.lru.gpuHeld[r]!;
  }

  /** The tier `replica` holds the last block of the chain `hashes` in, or undefined when it does not hold the chain. */
  tierOf(replica: string, hashes: readonly string[]): BlockTier | undefined {
    const r = this.replicaIds.get(replica);
    if (r === undefined || hashes.length === 0) return undefined;
    let parent = ROOT;
    let entry = NONE;
    for (const hash of hashes) {
      if (!this.parseKey(hash, false)) return undefined;
      const node = this.nodes.find(this.keyLo, this.keyHi, parentKey(parent, this.keyKind));
      if (node === NONE) return undefined;
      entry = this.entries.find(node, r);
      if (entry === NONE) return undefined;
      parent = node;
    }
    return TIER_NAME[this.lru.tier[entry]!];
  }

  /** Node and entry counts and the bytes they take. */
  stats(): FleetPrefixIndexStats {
    const allocatedBytes =
      this.nodeLo.byteLength +
      this.nodeHi.byteLength +
      this.nodeParentKey.byteLength +
      this.nodeHolders.byteLength +
      this.nodeHolderCount.byteLength +
      this.nodes.bytes +
      this.entryNode.byteLength +
      this.entryReplica.byteLength +
      this.holderPrev.byteLength +
      this.holderNext.byteLength +
      this.entryChildren.byteLength +
      this.lru.bytes +
      this.entries.bytes;
    const liveBytes =
      this.nodes.size * NODE_BYTES + this.nodes.bytes + this.entries.size * ENTRY_BYTES + this.entries.bytes;
    return {
      nodes: this.nodes.size,
      entries: this.entries.size,
      replicas: this.replicaIds.size,
      allocatedBytes,
      liveBytes: Math.round(liveBytes),
    };
  }

  /**
   * Checks the structure (tables, lists, counts, the holder-subset, recency and leaves-first
   * invariants); throws on the first inconsistency. For tests: it visits everything.
   */
  checkInvariants(): void {
    const lru = this.lru;
    let entries = 0;
    /** Per entry id, the children its replica holds, counted from the parent links. */
    const childrenSeen = new Map<number, number>();
    for (const [name, r] of this.replicaIds) {
      const rank = new Map<number, number>();
      let n = 0;
      let gpu = 0;
      let inHost = false;
      let prev = NONE;
      for (let e = lru.head[r]!; e !== NONE; e = lru.next[e]!) {
        if (lru.prev[e] !== prev) throw new Error(`broken LRU links of ${name}`);
        if (e === lru.hostHead[r]) inHost = true;
        if ((lru.tier[e] !== GPU) !== inHost) throw new Error(`a tier out of place in the LRU of ${name}`);
        if (!inHost) gpu++;
        if (this.entryReplica[e] !== r) throw new Error(`foreign entry in the LRU of ${name}`);
        if (this.entries.find(this.entryNode[e]!, r) !== e)
          throw new Error(`entry of ${name} not in its table`);
        rank.set(this.entryNode[e]!, n++);
        prev = e;
      }
      if (lru.tail[r] !== prev) throw new Error(`LRU tail of ${name} is not its last entry`);
      if (n !== lru.held[r]) throw new Error(`${name} holds ${n} entries, counted ${lru.held[r]}`);
      if (lru.hostHead[r] !== NONE && !inHost) throw new Error(`the host head of ${name} is not in its LRU`);
      if (gpu !== lru.gpuHeld[r])
        throw new Error(`${name} holds ${gpu} GPU entries, counted ${lru.gpuHeld[r]}`);
      if (gpu > lru.capacity[r]!)
        throw new Error(`${name} holds ${gpu} GPU entries over capacity ${lru.capacity[r]}`);
      if (n - gpu > lru.hostCapacity[r]!)
        throw new Error(`${name} holds ${n - gpu} host entries over capacity ${lru.hostCapacity[r]}`);
      for (const [node, position] of rank) {
        const parent = this.parentOf(node);
        if (parent === ROOT) continue;
        const parentPosition = rank.get(parent);
        if (parentPosition === undefined) throw new Error(`${name} holds a block without its parent`);
        if (parentPosition > position) throw new Error(`${name} holds a block more recent than its parent`);
        const parentEntry = this.entries.find(parent, r);
        childrenSeen.set(parentEntry, (childrenSeen.get(parentEntry) ?? 0) + 1);
      }
      entries += n;
    }
    if (entries !== this.entries.size)
      throw new Error(`entries counted ${this.entries.size}, found ${entries}`);
    let nodes = 0;
    for (const node of this.nodes.ids()) {
      nodes++;
      let holders = 0;
      let last = NONE;
      let leaves = true;
      for (let e = this.nodeHolders[node]!; e !== NONE; e = this.holderNext[e]!) {
        if (this.entryNode[e] !== node) throw new Error("foreign entry in a holder list");
        if (last !== NONE && this.holderPrev[e] !== last) throw new Error("broken holder links");
        const children = this.childCount(e);
        if (children !== (childrenSeen.get(e) ?? 0))
          throw new Error(`an entry counts ${children} children, holds ${childrenSeen.get(e) ?? 0}`);
        if (children > 0) leaves = false;
        else if (!leaves) throw new Error("a leaf holder listed after a holder with children");
        holders++;
        last = e;
      }
      if (holders === 0 || holders !== this.nodeHolderCount[node]) throw new Error("holder count mismatch");
      if (this.holderPrev[this.nodeHolders[node]!] !== last)
        throw new Error("a holder list's head does not link its last");
    }
    if (nodes !== this.nodes.size) throw new Error(`nodes counted ${this.nodes.size}, found ${nodes}`);
  }

  // --- keys ---

  /**
   * Parses a hash into the key fields: 16 lowercase hex digits as two 32-bit halves, any other
   * string by its intern id. Returns false when the string is not interned and `intern` is false
   * (then no node can have it).
   */
  private parseKey(hash: string, intern: boolean): boolean {
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

  private parentOf(node: number): number {
    return (this.nodeParentKey[node]! >> 1) - 1;
  }

  /** Adds a node for the parsed key under `parent`. */
  private addNode(parent: number): number {
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

  private removeNode(node: number): void {
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

  private growNodes(): void {
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
  private listFirst(node: number, entry: number): void {
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
  private listLast(node: number, entry: number): void {
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

  private unlist(node: number, entry: number): void {
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

  private childCount(entry: number): number {
    const n = this.entryChildren[entry]!;
    return n === MANY ? this.manyChildren.get(entry)! : n;
  }

  /** One more child held under `entry`: a leaf becomes a holder with children, listed last. */
  private addChild(entry: number): void {
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
  private removeChild(entry: number): void {
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
  private addEntry(node: number, replica: number, parentEntry: number): number {
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
  private evict(entry: number, replica: number): void {
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

  private growEntries(): void {
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
  private grownLength(length: number): number {
    let total = 0;
    for (const r of this.replicaIds.values()) total += this.lru.capacity[r]! + this.lru.hostCapacity[r]!;
    const wanted = Math.ceil(length * 1.5);
    return total > length ? Math.min(wanted, total) : length + Math.max(64, Math.ceil(length / 8));
  }

  // --- replicas ---

  private replicaSlot(replica: string): number {
    let r = this.replicaIds.get(replica);
    if (r !== undefined) return r;
    r = this.replicaFree.pop() ?? this.replicaName.length;
    this.replicaIds.set(replica, r);
    this.replicaName[r] = replica;
    this.lru.reset(r);
    return r;
  }

  /** Applies the replica's capacities: GPU overflow to host, host overflow forgotten. */
  private trim(replica: number): void {
    for (let e = this.lru.overflow(replica); e !== NONE; e = this.lru.overflow(replica))
      this.evict(e, replica);
  }
}

/**
 * Eight hex digits of `hash` from `from` as one 32-bit word (signed, as `<<` leaves it), or NaN
 * when any of them is not a lowercase hex digit.
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
