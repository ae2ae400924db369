/**
 * @module The two request flows of disaggregated serving an upstream may speak, and how each one's
 * parameters go into a call's body.
 *
 * **vLLM** (the default): the prefill call carries `kv_transfer_params.do_remote_decode`, and the
 * decode call the `kv_transfer_params` the prefill answered (vllm-project/vllm,
 * tests/v1/kv_connector/nixl_integration/toy_proxy_server.py).
 *
 * **SGLang's PD mode**: one request goes to the prefill and the decode server at once, both with
 * the same three top-level fields — `bootstrap_host` (the prefill server's host), `bootstrap_port`
 * (its bootstrap server's port, `--disaggregation-bootstrap-port`, 8998 by default) and
 * `bootstrap_room` (a random integer in [0, 2⁶³ − 1] that pairs the two). The decode server joins
 * the prefill server's bootstrap server, allocates the KV and waits; the prefill server waits for
 * it, computes the prompt, pushes the KV and answers one token once the transfer is done; the
 * decode server's answer is the client's, streamed as it comes. sgl-project/sglang:
 * python/sglang/srt/disaggregation/mini_lb.py @ 001c2ae0901cd353c26fed2f435887c867b73eed
 * (`_forward_to_backend`, `_generate_bootstrap_room`, `generate_stream`),
 * sgl-router/src/routers/http/pd_router.rs @ 0105f2a36d55a8cc4f6521ba40aae17654486f52
 * (`inject_bootstrap_into_value`, `execute_dual_dispatch_internal`: the prefill's answer is
 * drained and discarded, the decode's passed through, a decode error answered with its status),
 * sgl-router/src/routers/http/pd_types.rs @ 20a9d0e448de6961d587a5d0aaebb11a81a51825
 * (`get_hostname`, `generate_room_id`), python/sglang/srt/server_args.py
 * (`disaggregation_bootstrap_port: int = 8998`), python/sglang/srt/managers/scheduler.py (a
 * request without `bootstrap_room` is refused 400 "Disaggregated request received without
 * bootstrap room id"), python/sglang/srt/disaggregation/prefill.py (the prefill finishes with
 * `FINISH_LENGTH(length=0)` once its KV was sent).
 */

import type { EngineCall, ReplicaRole } from "../../../src/engine.js";

/** Which request flow a disaggregated upstream speaks. */
export type PdProtocol = "vllm" | "sglang";

export const PD_PROTOCOLS: readonly PdProtocol[] = ["vllm", "sglang"];

/** SGLang's default `--disaggregation-bootstrap-port`. */
export const SGLANG_DEFAULT_BOOTSTRAP_PORT = 8998;

/** The fields SGLang's router adds to both copies of a request. */
export type SglangBootstrap = {
  bootstrap_host: string;
  bootstrap_port: number;
  bootstrap_room: number;
};

/**
 * A fresh room. SGLang's routers draw from [0, 2⁶³ − 1]; sluice draws from
 * [0, 2⁵³ − 1], which a JSON number carries exactly in any language, so the
 * two servers can never read two different rooms.
 */
export function sglangBootstrapRoom(): number {
  return Math.floor(Math.random() * 2 ** 21) * 2 ** 32 + Math.floor(Math.random() * 2 ** 32);
}

/** The host part of the prefill server's URL, unbracketed for IPv6, as SGLang's router sends it. */
export function bootstrapHostOf(baseUrl: string): string {
  return new URL(baseUrl).hostname.replace(/^\[(.*)\]$/, "$1");
}

/** Whether a call's parameters are SGLang's bootstrap fields (both legs carry the same ones). */
export function isSglangBootstrap(params: Readonly<Record<string, unknown>> | undefined): boolean {
  return params !== undefined && "bootstrap_room" in params;
}

/**
 * Puts a call's hand-over parameters into the body sent upstream: vLLM's in
 * `kv_transfer_params`, SGLang's as top-level fields. A prefill leg loses its
 * output floor either way (it stops at its first token).
 */
export function applyKvTransfer(body: Record<string, unknown>, call: EngineCall, role: ReplicaRole): void {
  const params = call.kvTransferParams;
  if (!params) return;
  const sglang = isSglangBootstrap(params);
  if (sglang) Object.assign(body, params);
  else body.kv_transfer_params = { ...params };
  if (params.do_remote_decode === true || (sglang && role === "prefill")) {
    // A prefill leg, as vLLM's toy proxy sends it (output floors are not supported there; the decode leg keeps them),
    // and as SGLang's prefill server runs it whatever it is asked: to its first token.
    delete body.min_tokens;
    delete body.min_completion_tokens;
  }
}
