/** @module Requests Node's HTTP parser rejects before any handler runs, answered with the docs/http-api.md envelope. */

import type { EventEmitter } from "node:events";
import type { Duplex } from "node:stream";
import { Refusal, renderRefusal } from "../../src/errors.js";
import { newRequestId } from "../openai-api/request-id.js";
import { closeAfterLinger } from "./linger.js";

const REASON_PHRASES: Record<number, string> = {
  400: "Bad Request",
  408: "Request Timeout",
  413: "Payload Too Large",
  431: "Request Header Fields Too Large",
};

/** The status and message for a parser error code (`HPE_*`, `ERR_HTTP_*`). */
function describe(code: string | undefined): { status: number; message: string } {
  switch (code) {
    case "HPE_HEADER_OVERFLOW":
      return { status: 431, message: "request headers are larger than the server accepts" };
    case "ERR_HTTP_REQUEST_TIMEOUT":
    case "ERR_HTTP_HEADERS_TIMEOUT":
      return { status: 408, message: "the request did not arrive in time" };
    case "HPE_CHUNK_EXTENSIONS_OVERFLOW":
      return { status: 413, message: "chunk extensions are larger than the server accepts" };
    default:
      return {
        status: 400,
        message: `malformed HTTP request (${code ?? "parse error"}): invalid characters in a header, a bad request line, or a body that does not match its length`,
      };
  }
}

/** The raw HTTP/1.1 response for a request the parser rejected; the connection is closed after it. */
export function clientErrorResponse(code: string | undefined): string {
  const { status, message } = describe(code);
  const requestId = newRequestId();
  const refusal = new Refusal(status === 413 ? "body_too_large" : "invalid_request", message, { status });
  const rendered = renderRefusal(refusal, requestId);
  const body = JSON.stringify(rendered.body);
  const head = [
    `HTTP/1.1 ${status} ${REASON_PHRASES[status] ?? "Bad Request"}`,
    "content-type: application/json",
    `content-length: ${Buffer.byteLength(body)}`,
    `x-request-id: ${requestId}`,
    "connection: close",
  ];
  return `${head.join("\r\n")}\r\n\r\n${body}`;
}

/**
 * Answers parser errors (control characters in a header, oversized headers,
 * a body longer than its `content-length`) with the JSON envelope instead of
 * Node's bare `400`, then closes the connection after a short linger. A
 * socket that already sent part of a response, or can no longer be written,
 * is only destroyed.
 */
export function answerClientErrors(server: EventEmitter): void {
  server.on("clientError", function clientError(err: NodeJS.ErrnoException, socket: Duplex) {
    const inFlight = (socket as Duplex & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
    if (err.code === "ECONNRESET" || !socket.writable || inFlight?.headersSent) {
      socket.destroy();
      return;
    }
    socket.write(clientErrorResponse(err.code));
    // What follows the bad request (a body longer than its length, say) is not read; the linger lets the
    // client read the answer before the connection goes.
    closeAfterLinger(socket);
  });
}
