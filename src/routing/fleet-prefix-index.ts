/**
 * @module One prefix index for the whole fleet (docs/routing.md): a tree of chained block hashes
 * whose nodes list the replicas holding the block, so one walk of a prompt's blocks yields every
 * replica's longest unbroken prefix, whatever the fleet size. Each replica keeps its own LRU of
 * (block, replica) entries, sized to its KV capacity in blocks and cut in a GPU and a host tier
 * (`tiered-lru.ts`), threaded through the same entries.
 *
 * This module holds the walks that answer queries (record, match, tiers, stats); the storage they
 * walk — typed arrays, the two open-addressing tables (`id-table.ts`), holder lists, eviction —
 * is `fleet-prefix-store.ts`, which an entry costs a few dozen bytes in and no JS object.
 */

import { ENTRY_BYTES, FleetPrefixStore, NODE_BYTES, parentKey, ROOT } from "./fleet-prefix-store.js";
import { NONE } from "./id-table.js";
import { GPU } from "./tiered-lru.js";

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
export class FleetPrefixIndex extends FleetPrefixStore {
  private readonly capacityOf: (replica: string) => number;
  private readonly hostCapacityOf: (replica: string) => number;

  /** Scratch for `stopAt`: per replica slot, the stamp of the last check that saw it hold the child. */
  private stamps = new Int32Array(64);
  private stamp = 0;

  /** Scratch for `match` and `matchReplica`: the nodes of the walked path. */
  private path = new Int32Array(256);

  constructor(options: FleetPrefixIndexOptions) {
    super();
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
}
