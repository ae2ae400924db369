/** @module Closing a connection whose request was refused unread, without cutting off the refusal itself. */

import type { IncomingMessage, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";

/** How long a connection whose request was refused unread stays open after the refusal, ms. */
export const LINGER_MS = 1000;

/**
 * Stops reading `socket`, closes its sending side once what was written has
 * gone, and destroys it `lingerMs` later. Nothing more of the request is
 * read: the client's bytes wait in the kernel until its window fills.
 * Destroying at once instead would make the kernel answer the client's next
 * bytes with a reset that can discard the refusal before the client reads it.
 */
export function closeAfterLinger(socket: Duplex, lingerMs = LINGER_MS): void {
  if (socket.destroyed) return;
  socket.pause();
  // The HTTP parser reads the socket's handle directly; stop that too.
  (socket as unknown as { _handle?: { readStop?: () => void } })._handle?.readStop?.();
  socket.end();
  // Real time on purpose: this bounds a socket, not a scheduling decision.
  const timer = setTimeout(() => socket.destroy(), lingerMs);
  timer.unref();
  socket.once("close", () => clearTimeout(timer));
}

/**
 * Once `outgoing` (a refusal sent before the body was read, such as 413
 * `body_too_large`) has been written, closes the connection after a linger
 * ({@link closeAfterLinger}). Keeping it alive instead would read and discard
 * the whole body to find the next request.
 */
export function lingerThenClose(
  incoming: IncomingMessage,
  outgoing: ServerResponse,
  lingerMs = LINGER_MS,
): void {
  if (incoming.readableEnded) return;
  outgoing.once("finish", () => {
    const socket = incoming.socket;
    if (socket) closeAfterLinger(socket, lingerMs);
  });
}
