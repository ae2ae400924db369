/**
 * @module How two simulated replicas speaking SGLang's PD mode meet: the decode server joins the
 * prefill server named by a request's `bootstrap_host:bootstrap_port` in its `bootstrap_room`, and
 * the prefill server computes the prompt only once its decode server joined, as SGLang's prefill
 * waits in its bootstrap queue for the decode side (sgl-project/sglang,
 * python/sglang/srt/disaggregation/prefill.py, decode.py). SGLang's bootstrap server and transfer
 * engine are its own (an HTTP registry plus Mooncake/NIXL); the simulator's meeting is one HTTP
 * request, `POST /sim/bootstrap/join`, answered on the prefill server's own port once the prompt's
 * KV is ready to cross, and the crossing itself is timed on the decode replica's link.
 */

/** What a prefill hands its decode server: the prompt whose KV crosses. */
export interface Handover {
  promptTokens: number;
}

/** A room on a prefill server: its decode server's arrival, and the hand-over. */
interface Room {
  prefillArrived: boolean;
  joined: Deferred<void>;
  handover: Deferred<Handover>;
}

interface Deferred<T> {
  promise: Promise<T>;
  resolve(value: T): void;
  reject(error: unknown): void;
}

function deferred<T>(): Deferred<T> {
  let resolve!: (value: T) => void;
  let reject!: (error: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // Either side may be gone when the other settles it.
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}

/** Settles with `promise`, or rejects with the signal's reason when it aborts first. */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  signal.throwIfAborted();
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/** A request used a room another request of the same role already holds. */
export class RoomTaken extends Error {}

/**
 * The rooms of one prefill server. A room is made by whichever of its two
 * requests arrives first (the router sends them at once) and forgotten once
 * the prefill handed its KV over or either side left.
 */
export class BootstrapRooms {
  private readonly rooms = new Map<number, Room>();

  private room(id: number): Room {
    let room = this.rooms.get(id);
    if (!room) {
      room = { prefillArrived: false, joined: deferred(), handover: deferred() };
      this.rooms.set(id, room);
    }
    return room;
  }

  /**
   * The prefill request of room `id`: waits for its decode server to join,
   * then runs `compute` (the prompt, to its first token) and hands the KV over.
   */
  async prefill(id: number, signal: AbortSignal, compute: () => Promise<Handover>): Promise<void> {
    const room = this.room(id);
    if (room.prefillArrived) throw new RoomTaken(`bootstrap_room ${id} already has a prefill request`);
    room.prefillArrived = true;
    try {
      await untilAborted(room.joined.promise, signal);
      room.handover.resolve(await compute());
    } catch (error) {
      room.handover.reject(error);
      throw error;
    } finally {
      if (this.rooms.get(id) === room) this.rooms.delete(id);
    }
  }

  /** A decode server joins room `id`; resolves once the prefill handed the KV over. */
  async join(id: number, signal: AbortSignal): Promise<Handover> {
    const room = this.room(id);
    room.joined.resolve();
    try {
      return await untilAborted(room.handover.promise, signal);
    } finally {
      // A decode server that leaves before its prefill arrived takes the room with it.
      if (!room.prefillArrived && this.rooms.get(id) === room) this.rooms.delete(id);
    }
  }

  /** Rooms open (a test's check that none leaks). */
  get size(): number {
    return this.rooms.size;
  }
}

/**
 * A decode server joins its prefill server's room; resolves with the
 * hand-over, rejects with why it failed (the prefill server could not be
 * reached, answered an error, or `signal` aborted).
 */
export async function joinPrefill(
  host: string,
  port: number,
  room: number,
  signal: AbortSignal,
): Promise<Handover> {
  const address = host.includes(":") ? `[${host}]` : host;
  const response = await fetch(`http://${address}:${port}/sim/bootstrap/join`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ bootstrap_room: room }),
    signal,
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`the prefill server answered ${response.status}: ${text.slice(0, 300)}`);
  const body = JSON.parse(text) as { prompt_tokens?: unknown };
  if (typeof body.prompt_tokens !== "number")
    throw new Error(`the prefill server answered no hand-over: ${text}`);
  return { promptTokens: body.prompt_tokens };
}
