/**
 * @module One prefix index for the whole fleet (SPEC 7, 3.6): a tree of chained block hashes whose
 * nodes list the replicas holding the block, so one walk of a prompt's blocks yields every
 * replica's longest unbroken prefix, whatever the fleet size. Each replica keeps its own LRU of
 * (block, replica) entries, sized to its KV capacity in blocks, threaded through the same entries.
 *
 * A replica with a host-memory KV tier (docs/tiers.md) keeps a longer LRU: its most recent
 * `capacityBlocks` entries are taken to be in GPU memory and the next `hostCapacityBlocks` in host
 * memory only. That is what a write-back host tier does — a block GPU memory evicts (its least
 * recently used) moves to the head of the host LRU, and one used again moves back — so one LRU cut
 * in two predicts both tiers from what was routed, without KV events.
 *
 * Storage is struct-of-arrays in typed arrays with two open-addressing hash tables (node by
 * (parent, hash), entry by (node, replica)), so an entry costs a few dozen bytes and no JS object.
 */

/** Where a replica is predicted to hold a block: GPU memory, or only host memory (loaded back before use). */
export type BlockTier = "gpu" | "host";

const GPU = 0;
const HOST = 1;
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

const NONE = -1;
/** Parent id of a first block. */
const ROOT = -1;
/** Hash tables grow past this load (linear probing stays short below it)… */
const MAX_LOAD = 0.7;
/** …to this load: tables are sized to their count, not to powers of two. */
const REHASH_LOAD = 0.5;
/** Bytes per node: hi, lo, parent, holder head, holder count (Int32) and kind (Uint8). */
const NODE_BYTES = 5 * 4 + 1;
/** Bytes per entry: node, replica, LRU prev/next, holder prev/next (Int32) and tier (Uint8). */
const ENTRY_BYTES = 6 * 4 + 1;

/** Hex digit values of lowercase `0-9a-f`, −1 elsewhere (the form `blockHashes` renders). */
const HEX_VALUE = (() => {
  const table = new Int8Array(128).fill(-1);
  for (let i = 0; i < 16; i++) table["0123456789abcdef".charCodeAt(i)] = i;
  return table;
})();

function mix(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x7feb352d);
  h ^= h >>> 15;
  h = Math.imul(h, 0x846ca68b);
  return h ^ (h >>> 16);
}

function nodeHash(parent: number, hi: number, lo: number): number {
  return mix(hi ^ mix(lo ^ Math.imul(parent + 1, 0x9e3779b1)));
}

function entryHash(node: number, replica: number): number {
  return mix(Math.imul(node, 0x9e3779b1) ^ Math.imul(replica + 1, 0x85ebca6b));
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

function grownInt32(old: Int32Array<ArrayBuffer>, length: number, fill?: number): Int32Array<ArrayBuffer> {
  const next = new Int32Array(length);
  next.set(old);
  if (fill !== undefined) next.fill(fill, old.length);
  return next;
}

function grownUint8(old: Uint8Array<ArrayBuffer>, length: number): Uint8Array<ArrayBuffer> {
  const next = new Uint8Array(length);
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
 * never strands a descendant, and along any path the holder sets only shrink — which is what lets
 * `match` notice where a replica's prefix ends by comparing holder counts.
 *
 * Tiers: a replica's LRU list is its GPU entries, then (from `hostHead`) its host entries. A parent
 * being more recent than its child, along any path a replica's blocks are GPU blocks, then host
 * blocks: the longest prefix splits at one depth, found by bisection.
 */
export class FleetPrefixIndex {
  private readonly capacityOf: (replica: string) => number;
  private readonly hostCapacityOf: (replica: string) => number;

  // Nodes.
  private nodeHi = new Int32Array(64);
  private nodeLo = new Int32Array(64);
  private nodeParent = new Int32Array(64);
  /** First holder entry; for a free node, the next free node. */
  private nodeHolders = new Int32Array(64);
  private nodeHolderCount = new Int32Array(64);
  /** 0: a rendered 64-bit hash (hi, lo); 1: any other string, interned (hi = intern id). */
  private nodeKind = new Uint8Array(64);
  private nodeSlots = new Int32Array(128).fill(NONE);
  private nodeCount = 0;
  private nodeHigh = 0;
  private nodeFree = NONE;

  // Entries.
  private entryNode = new Int32Array(64);
  private entryReplica = new Int32Array(64);
  /** Towards the more recent entry of the same replica. */
  private lruPrev = new Int32Array(64);
  /** Towards the less recent entry; for a free entry, the next free entry. */
  private lruNext = new Int32Array(64);
  private holderPrev = new Int32Array(64);
  private holderNext = new Int32Array(64);
  private entryTier = new Uint8Array(64);
  private entrySlots = new Int32Array(128).fill(NONE);
  private entryCount = 0;
  private entryHigh = 0;
  private entryFree = NONE;

  // Replicas.
  private readonly replicaIds = new Map<string, number>();
  private readonly replicaName: string[] = [];
  private readonly lruHead: number[] = [];
  private readonly lruTail: number[] = [];
  private readonly held: number[] = [];
  private readonly capacity: number[] = [];
  /** Entries in GPU memory; the rest of `held` are host entries. */
  private readonly gpuHeld: number[] = [];
  private readonly hostCapacity: number[] = [];
  /** The most recent host entry (every later entry in the LRU is host too), NONE when there is none. */
  private readonly hostHead: number[] = [];
  private readonly replicaFree: number[] = [];

  // Hashes that are not 16 lowercase hex digits, interned while a node uses them.
  private readonly internIds = new Map<string, number>();
  private readonly internName: string[] = [];
  private readonly internRefs: number[] = [];
  private readonly internFree: number[] = [];

  /** Scratch for `match`: per replica slot, the stamp of the last drop check that saw it hold the block. */
  private stamps = new Int32Array(64);
  private stamp = 0;

  /** Scratch for `matchReplica`: the nodes of the walked path. */
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
    this.capacity[r] = checkCapacity(replica, this.capacityOf(replica));
    this.hostCapacity[r] = checkHostCapacity(replica, this.hostCapacityOf(replica));
    let parent = ROOT;
    let cursor = NONE;
    for (let i = 0; i < hashes.length; i++) {
      this.parseKey(hashes[i]!, true);
      let node = this.findNode(parent, this.keyHi, this.keyLo, this.keyKind);
      if (node === NONE) node = this.addNode(parent);
      let entry = this.findEntry(node, r);
      if (entry === NONE) entry = this.addEntry(node, r);
      else this.unlinkLru(entry, r);
      // Right behind a GPU entry (or at the head): still ahead of `hostHead`, so in the GPU part.
      this.linkLruAfter(entry, r, cursor);
      this.entryTier[entry] = GPU;
      this.gpuHeld[r]!++;
      cursor = entry;
      parent = node;
    }
    this.trim(r);
  }

  /**
   * Every replica's longest unbroken prefix of `hashes`, in blocks; replicas with none are left
   * out. One walk down the tree: the cost is the matched depth plus, where a replica's prefix
   * ends, the holders of the last block it shared — not the fleet size.
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
      const node = this.findNode(parent, this.keyHi, this.keyLo, this.keyKind);
      if (node === NONE) break;
      if (gpuBlocks !== undefined) path[depth] = node;
      if (parent !== ROOT && counts[node]! < counts[parent]!) {
        // Holders only shrink along a path: those of the parent not stamped as holders here stop at `depth`.
        const stamp = this.nextStamp();
        const stamps = this.stamps;
        for (let e = this.nodeHolders[node]!; e !== NONE; e = this.holderNext[e]!) {
          stamps[this.entryReplica[e]!] = stamp;
        }
        for (let e = this.nodeHolders[parent]!; e !== NONE; e = this.holderNext[e]!) {
          const r = this.entryReplica[e]!;
          if (stamps[r] !== stamp) result.set(this.replicaName[r]!, depth);
        }
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
      const node = this.findNode(parent, this.keyHi, this.keyLo, this.keyKind);
      if (node === NONE) break;
      path[depth] = node;
      parent = node;
    }
    // Invariant: r holds path[0 … lo−1] and not path[hi … depth−1].
    let lo = 0;
    let hi = depth;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.findEntry(path[mid]!, r) !== NONE) lo = mid + 1;
      else hi = mid;
    }
    if (tiers !== undefined) tiers.gpuBlocks = this.gpuDepth(r, lo);
    return lo;
  }

  /** How many of the first `blocks` nodes of `this.path`, all held by `r`, it holds in GPU memory. */
  private gpuDepth(r: number, blocks: number): number {
    if (this.hostHead[r] === NONE) return blocks;
    // Invariant: path[0 … lo−1] are GPU entries of r, path[hi … blocks−1] host entries.
    let lo = 0;
    let hi = blocks;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.entryTier[this.findEntry(this.path[mid]!, r)] === GPU) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /** Forgets everything `replica` holds (it left, restarted or reset its prefix cache). */
  forget(replica: string): void {
    const r = this.replicaIds.get(replica);
    if (r === undefined) return;
    while (this.lruTail[r] !== NONE) this.evict(this.lruTail[r]!, r);
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
    this.capacity[r] = max;
    this.hostCapacity[r] = hostMax;
    this.trim(r);
  }

  /** Blocks `replica` holds, in both tiers. */
  blocksHeld(replica: string): number {
    const r = this.replicaIds.get(replica);
    return r === undefined ? 0 : this.held[r]!;
  }

  /** Blocks `replica` holds in GPU memory. */
  gpuBlocksHeld(replica: string): number {
    const r = this.replicaIds.get(replica);
    return r === undefined ? 0 : this.gpuHeld[r]!;
  }

  /** The tier `replica` holds the last block of the chain `hashes` in, or undefined when it does not hold the chain. */
  tierOf(replica: string, hashes: readonly string[]): BlockTier | undefined {
    const r = this.replicaIds.get(replica);
    if (r === undefined || hashes.length === 0) return undefined;
    let parent = ROOT;
    let entry = NONE;
    for (const hash of hashes) {
      if (!this.parseKey(hash, false)) return undefined;
      const node = this.findNode(parent, this.keyHi, this.keyLo, this.keyKind);
      if (node === NONE) return undefined;
      entry = this.findEntry(node, r);
      if (entry === NONE) return undefined;
      parent = node;
    }
    return TIER_NAME[this.entryTier[entry]!];
  }

  /** Node and entry counts and the bytes they take. */
  stats(): FleetPrefixIndexStats {
    const allocatedBytes =
      this.nodeHi.byteLength +
      this.nodeLo.byteLength +
      this.nodeParent.byteLength +
      this.nodeHolders.byteLength +
      this.nodeHolderCount.byteLength +
      this.nodeKind.byteLength +
      this.nodeSlots.byteLength +
      this.entryNode.byteLength +
      this.entryReplica.byteLength +
      this.lruPrev.byteLength +
      this.lruNext.byteLength +
      this.holderPrev.byteLength +
      this.holderNext.byteLength +
      this.entryTier.byteLength +
      this.entrySlots.byteLength;
    const liveBytes =
      this.nodeCount * NODE_BYTES +
      this.nodeSlots.byteLength +
      this.entryCount * ENTRY_BYTES +
      this.entrySlots.byteLength;
    return {
      nodes: this.nodeCount,
      entries: this.entryCount,
      replicas: this.replicaIds.size,
      allocatedBytes,
      liveBytes: Math.round(liveBytes),
    };
  }

  /**
   * Checks the structure (tables, lists, counts, the holder-subset and recency invariants);
   * throws on the first inconsistency. For tests: it visits everything.
   */
  checkInvariants(): void {
    let entries = 0;
    for (const [name, r] of this.replicaIds) {
      const rank = new Map<number, number>();
      let n = 0;
      let gpu = 0;
      let inHost = false;
      let prev = NONE;
      for (let e = this.lruHead[r]!; e !== NONE; e = this.lruNext[e]!) {
        if (this.lruPrev[e] !== prev) throw new Error(`broken LRU links of ${name}`);
        if (e === this.hostHead[r]) inHost = true;
        if ((this.entryTier[e] === HOST) !== inHost)
          throw new Error(`a tier out of place in the LRU of ${name}`);
        if (!inHost) gpu++;
        if (this.entryReplica[e] !== r) throw new Error(`foreign entry in the LRU of ${name}`);
        if (this.findEntry(this.entryNode[e]!, r) !== e) throw new Error(`entry of ${name} not in its table`);
        rank.set(this.entryNode[e]!, n++);
        prev = e;
      }
      if (this.lruTail[r] !== prev) throw new Error(`LRU tail of ${name} is not its last entry`);
      if (n !== this.held[r]) throw new Error(`${name} holds ${n} entries, counted ${this.held[r]}`);
      if (this.hostHead[r] !== NONE && !inHost) throw new Error(`the host head of ${name} is not in its LRU`);
      if (gpu !== this.gpuHeld[r])
        throw new Error(`${name} holds ${gpu} GPU entries, counted ${this.gpuHeld[r]}`);
      if (gpu > this.capacity[r]!)
        throw new Error(`${name} holds ${gpu} GPU entries over capacity ${this.capacity[r]}`);
      if (n - gpu > this.hostCapacity[r]!)
        throw new Error(`${name} holds ${n - gpu} host entries over capacity ${this.hostCapacity[r]}`);
      for (const [node, position] of rank) {
        const parent = this.nodeParent[node]!;
        if (parent === ROOT) continue;
        const parentPosition = rank.get(parent);
        if (parentPosition === undefined) throw new Error(`${name} holds a block without its parent`);
        if (parentPosition > position) throw new Error(`${name} holds a block more recent than its parent`);
      }
      entries += n;
    }
    if (entries !== this.entryCount) throw new Error(`entries counted ${this.entryCount}, found ${entries}`);
    let nodes = 0;
    for (const node of this.nodeSlots) {
      if (node === NONE) continue;
      nodes++;
      let holders = 0;
      for (let e = this.nodeHolders[node]!; e !== NONE; e = this.holderNext[e]!) {
        if (this.entryNode[e] !== node) throw new Error("foreign entry in a holder list");
        holders++;
      }
      if (holders === 0 || holders !== this.nodeHolderCount[node]) throw new Error("holder count mismatch");
    }
    if (nodes !== this.nodeCount) throw new Error(`nodes counted ${this.nodeCount}, found ${nodes}`);
  }

  // --- keys ---

  /**
   * Parses a hash into the key fields: 16 lowercase hex digits as two 32-bit halves, any other
   * string by its intern id. Returns false when the string is not interned and `intern` is false
   * (then no node can have it).
   */
  private parseKey(hash: string, intern: boolean): boolean {
    if (hash.length === 16) {
      let hi = 0;
      let lo = 0;
      let ok = true;
      for (let i = 0; i < 8; i++) {
        const c = hash.charCodeAt(i);
        const d = c < 128 ? HEX_VALUE[c]! : -1;
        if (d < 0) {
          ok = false;
          break;
        }
        hi = (hi << 4) | d;
      }
      if (ok) {
        for (let i = 8; i < 16; i++) {
          const c = hash.charCodeAt(i);
          const d = c < 128 ? HEX_VALUE[c]! : -1;
          if (d < 0) {
            ok = false;
            break;
          }
          lo = (lo << 4) | d;
        }
      }
      if (ok) {
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

  private findNode(parent: number, hi: number, lo: number, kind: number): number {
    const slots = this.nodeSlots;
    const size = slots.length;
    for (let i = (nodeHash(parent, hi, lo) & 0x7fffffff) % size; ; i = i + 1 === size ? 0 : i + 1) {
      const node = slots[i]!;
      if (node === NONE) return NONE;
      if (
        this.nodeLo[node] === lo &&
        this.nodeHi[node] === hi &&
        this.nodeParent[node] === parent &&
        this.nodeKind[node] === kind
      ) {
        return node;
      }
    }
  }

  /** Adds a node for the parsed key under `parent`. */
  private addNode(parent: number): number {
    let node = this.nodeFree;
    if (node !== NONE) {
      this.nodeFree = this.nodeHolders[node]!;
    } else {
      if (this.nodeHigh === this.nodeHi.length) this.growNodes();
      node = this.nodeHigh++;
    }
    this.nodeHi[node] = this.keyHi;
    this.nodeLo[node] = this.keyLo;
    this.nodeKind[node] = this.keyKind;
    this.nodeParent[node] = parent;
    this.nodeHolders[node] = NONE;
    this.nodeHolderCount[node] = 0;
    if (this.keyKind === 1) this.internRefs[this.keyHi]!++;
    if (++this.nodeCount > this.nodeSlots.length * MAX_LOAD)
      this.rehashNodes(Math.ceil(this.nodeCount / REHASH_LOAD));
    this.insertNodeSlot(node);
    return node;
  }

  private insertNodeSlot(node: number): void {
    const slots = this.nodeSlots;
    const size = slots.length;
    let i = (nodeHash(this.nodeParent[node]!, this.nodeHi[node]!, this.nodeLo[node]!) & 0x7fffffff) % size;
    while (slots[i] !== NONE) i = i + 1 === size ? 0 : i + 1;
    slots[i] = node;
  }

  private removeNode(node: number): void {
    const slots = this.nodeSlots;
    const size = slots.length;
    let i = (nodeHash(this.nodeParent[node]!, this.nodeHi[node]!, this.nodeLo[node]!) & 0x7fffffff) % size;
    while (slots[i] !== node) i = i + 1 === size ? 0 : i + 1;
    // Backward-shift deletion: no tombstones, probes stay as short as the load allows.
    let j = i;
    for (;;) {
      j = j + 1 === size ? 0 : j + 1;
      const other = slots[j]!;
      if (other === NONE) break;
      const home =
        (nodeHash(this.nodeParent[other]!, this.nodeHi[other]!, this.nodeLo[other]!) & 0x7fffffff) % size;
      if (i <= j ? i < home && home <= j : i < home || home <= j) continue;
      slots[i] = other;
      i = j;
    }
    slots[i] = NONE;
    if (this.nodeKind[node] === 1) {
      const id = this.nodeHi[node]!;
      if (--this.internRefs[id]! === 0) {
        this.internIds.delete(this.internName[id]!);
        this.internName[id] = "";
        this.internFree.push(id);
      }
    }
    this.nodeHolders[node] = this.nodeFree;
    this.nodeFree = node;
    this.nodeCount--;
  }

  private growNodes(): void {
    const length = this.grownLength(this.nodeHi.length);
    this.nodeHi = grownInt32(this.nodeHi, length);
    this.nodeLo = grownInt32(this.nodeLo, length);
    this.nodeParent = grownInt32(this.nodeParent, length);
    this.nodeHolders = grownInt32(this.nodeHolders, length);
    this.nodeHolderCount = grownInt32(this.nodeHolderCount, length);
    this.nodeKind = grownUint8(this.nodeKind, length);
  }

  private rehashNodes(size: number): void {
    const old = this.nodeSlots;
    this.nodeSlots = new Int32Array(size).fill(NONE);
    for (const node of old) if (node !== NONE) this.insertNodeSlot(node);
  }

  // --- entries ---

  private findEntry(node: number, replica: number): number {
    const slots = this.entrySlots;
    const size = slots.length;
    for (let i = (entryHash(node, replica) & 0x7fffffff) % size; ; i = i + 1 === size ? 0 : i + 1) {
      const entry = slots[i]!;
      if (entry === NONE) return NONE;
      if (this.entryNode[entry] === node && this.entryReplica[entry] === replica) return entry;
    }
  }

  /** Adds the entry (node, replica), linked into the node's holders and not yet into the LRU. */
  private addEntry(node: number, replica: number): number {
    let entry = this.entryFree;
    if (entry !== NONE) {
      this.entryFree = this.lruNext[entry]!;
    } else {
      if (this.entryHigh === this.entryNode.length) this.growEntries();
      entry = this.entryHigh++;
    }
    this.entryNode[entry] = node;
    this.entryReplica[entry] = replica;
    const head = this.nodeHolders[node]!;
    this.holderPrev[entry] = NONE;
    this.holderNext[entry] = head;
    if (head !== NONE) this.holderPrev[head] = entry;
    this.nodeHolders[node] = entry;
    this.nodeHolderCount[node]!++;
    this.held[replica]!++;
    if (++this.entryCount > this.entrySlots.length * MAX_LOAD)
      this.rehashEntries(Math.ceil(this.entryCount / REHASH_LOAD));
    this.insertEntrySlot(entry);
    return entry;
  }

  private insertEntrySlot(entry: number): void {
    const slots = this.entrySlots;
    const size = slots.length;
    let i = (entryHash(this.entryNode[entry]!, this.entryReplica[entry]!) & 0x7fffffff) % size;
    while (slots[i] !== NONE) i = i + 1 === size ? 0 : i + 1;
    slots[i] = entry;
  }

  /** Removes an entry entirely: LRU, holders, table; frees its node when it was the last holder. */
  private evict(entry: number, replica: number): void {
    this.unlinkLru(entry, replica);
    const node = this.entryNode[entry]!;
    const prev = this.holderPrev[entry]!;
    const next = this.holderNext[entry]!;
    if (prev !== NONE) this.holderNext[prev] = next;
    else this.nodeHolders[node] = next;
    if (next !== NONE) this.holderPrev[next] = prev;
    const slots = this.entrySlots;
    const size = slots.length;
    let i = (entryHash(node, replica) & 0x7fffffff) % size;
    while (slots[i] !== entry) i = i + 1 === size ? 0 : i + 1;
    let j = i;
    for (;;) {
      j = j + 1 === size ? 0 : j + 1;
      const other = slots[j]!;
      if (other === NONE) break;
      const home = (entryHash(this.entryNode[other]!, this.entryReplica[other]!) & 0x7fffffff) % size;
      if (i <= j ? i < home && home <= j : i < home || home <= j) continue;
      slots[i] = other;
      i = j;
    }
    slots[i] = NONE;
    this.entryCount--;
    this.held[replica]!--;
    this.lruNext[entry] = this.entryFree;
    this.entryFree = entry;
    if (--this.nodeHolderCount[node]! === 0) this.removeNode(node);
  }

  private growEntries(): void {
    const length = this.grownLength(this.entryNode.length);
    this.entryNode = grownInt32(this.entryNode, length);
    this.entryReplica = grownInt32(this.entryReplica, length);
    this.lruPrev = grownInt32(this.lruPrev, length);
    this.lruNext = grownInt32(this.lruNext, length);
    this.holderPrev = grownInt32(this.holderPrev, length);
    this.holderNext = grownInt32(this.holderNext, length);
    this.entryTier = grownUint8(this.entryTier, length);
  }

  /**
   * The next length of the node or entry arrays: half as long again, but no longer than the
   * fleet's total capacity (neither can exceed it once trimmed), so a full fleet wastes no room.
   */
  private grownLength(length: number): number {
    let total = 0;
    for (const r of this.replicaIds.values()) total += this.capacity[r]! + this.hostCapacity[r]!;
    const wanted = Math.ceil(length * 1.5);
    return total > length ? Math.min(wanted, total) : length + Math.max(64, Math.ceil(length / 8));
  }

  private rehashEntries(size: number): void {
    const old = this.entrySlots;
    this.entrySlots = new Int32Array(size).fill(NONE);
    for (const entry of old) if (entry !== NONE) this.insertEntrySlot(entry);
  }

  // --- per-replica LRU ---

  private replicaSlot(replica: string): number {
    let r = this.replicaIds.get(replica);
    if (r !== undefined) return r;
    r = this.replicaFree.pop() ?? this.replicaName.length;
    this.replicaIds.set(replica, r);
    this.replicaName[r] = replica;
    this.lruHead[r] = NONE;
    this.lruTail[r] = NONE;
    this.held[r] = 0;
    this.gpuHeld[r] = 0;
    this.capacity[r] = 1;
    this.hostCapacity[r] = 0;
    this.hostHead[r] = NONE;
    return r;
  }

  /** A fresh stamp for `match`'s drop check, the stamp array covering every replica slot. */
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

  /** Takes `entry` out of the replica's LRU list, and out of its GPU count or off the host head. */
  private unlinkLru(entry: number, replica: number): void {
    const prev = this.lruPrev[entry]!;
    const next = this.lruNext[entry]!;
    if (this.entryTier[entry] === GPU) this.gpuHeld[replica]!--;
    else if (this.hostHead[replica] === entry) this.hostHead[replica] = next;
    if (prev !== NONE) this.lruNext[prev] = next;
    else this.lruHead[replica] = next;
    if (next !== NONE) this.lruPrev[next] = prev;
    else this.lruTail[replica] = prev;
  }

  /** Links `entry` right behind `after` in recency (at the head when `after` is NONE). */
  private linkLruAfter(entry: number, replica: number, after: number): void {
    const next = after === NONE ? this.lruHead[replica]! : this.lruNext[after]!;
    this.lruPrev[entry] = after;
    this.lruNext[entry] = next;
    if (after === NONE) this.lruHead[replica] = entry;
    else this.lruNext[after] = entry;
    if (next === NONE) this.lruTail[replica] = entry;
    else this.lruPrev[next] = entry;
  }

  /**
   * GPU entries beyond the GPU capacity move to host memory, least recent first (the entry just
   * ahead of the host head becomes it); host entries beyond the host capacity are forgotten.
   */
  private trim(replica: number): void {
    const max = this.capacity[replica]!;
    while (this.gpuHeld[replica]! > max) {
      const head = this.hostHead[replica]!;
      const last = head === NONE ? this.lruTail[replica]! : this.lruPrev[head]!;
      this.entryTier[last] = HOST;
      this.hostHead[replica] = last;
      this.gpuHeld[replica]!--;
    }
    const hostMax = this.hostCapacity[replica]!;
    while (this.held[replica]! - this.gpuHeld[replica]! > hostMax)
      this.evict(this.lruTail[replica]!, replica);
  }
}
