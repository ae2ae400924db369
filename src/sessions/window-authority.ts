/**
 * @module The window authority port: who decides how many sessions this
 * frontend may keep active on a replica. Alone, a frontend applies its own
 * window law; several frontends sharing a fleet (NATS JetStream KV) ask an
 * authority that keeps one window per replica for all of them.
 */

/** What one control tick knows about a replica, handed to the authority. */
export interface WindowTick {
  replica: string;
  /** The window this frontend's own law proposes after this tick's signals. */
  proposedSize: number;
  /** Applies one step of the window law to another current size (a shared window kept elsewhere). */
  law(currentSize: number): number;
  /** Whether this tick's signals were fresh and healthy (a stale tick must not move the window). */
  fresh: boolean;
  /** Whether the replica may take new sessions (healthy, and fresh signals or `--stale-signals open`). */
  accepting: boolean;
  /** This frontend's sessions on the replica, and its sessions waiting for any replica. */
  local: { active: number; paused: number; waiting: number };
}

/** The window this frontend may fill on a replica now. */
export interface WindowGrant {
  size: number;
  accepting: boolean;
}

export interface WindowAuthority {
  /** Called on every control tick for every replica; must answer at once (keep async work in the background). */
  decide(tick: WindowTick): WindowGrant;
  /**
   * A session holding `place` (window units) on `replica` was handed to another frontend. A shared
   * window keeps that place for the session's next holder rather than refilling it here: a new
   * session here must not take it in the moment before the next holder's demand is seen.
   */
  handedOver?(replica: string, place: number): void;
}

/** Where sessions opened by other frontends can be looked up (their pinned replica). */
export interface SessionDirectory {
  lookup(id: string): Promise<{ replica: string | null } | undefined>;
}
