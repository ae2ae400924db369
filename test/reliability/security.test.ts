/**
 * @module Security, each promise as a test: keys compared in constant time and never logged, admin
 * routes locked, priority and tenant only from the key, request ids sanitised, size limits enforced
 * before a body is read, and no CORS unless configured. The wire checks run against a real
 * `sluice serve` process.
 */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Registry } from "prom-client";
import { type RunningServer, startServer } from "../../adapters/cli/serve.js";
import { SimEngine } from "../../adapters/engines/sim/sim-engine.js";
import { ApiKeys, secretsEqual } from "../../adapters/http/api-keys.js";
import { createApp } from "../../adapters/http/app.js";
import { DEFAULT_BODY_LIMIT_BYTES } from "../../adapters/http/read-body.js";
import { createTokenizer } from "../../adapters/tokenizers/index.js";
import { VirtualClock } from "../../src/clock.js";
import { Scheduler } from "../../src/scheduler.js";
import { MAX_PIECE_RUN, PromptTokenizer, splitLongRuns } from "../../src/tokens/prompt-tokenizer.js";
import type { CallRequest } from "../../src/types.js";
import {
  assertQuiescent,
  checkRefusal,
  freePort,
  ROOT,
  rawHttp,
  recordFigures,
  type SluiceChild,
  spawnSluice,
  stopChild,
} from "./helpers.js";

const USER_KEY = "sk-user-7f3a9c2e51d04b8a";
const ADMIN_FLAGGED_KEY = "sk-opsadmin-c41d77e09a2b";
const ADMIN_KEY = "adm-9b1e4f7c2d8a6035e";
/** Near misses: they must not authenticate, and must not show up in any log either. */
const WRONG_KEYS = [
  "sk-user-7f3a9c2e51d04b8b",
  "sk-user-7f3a9c2e51d04b8",
  `${USER_KEY}x`,
  "sk-guess-0000000000",
];

const figures: Record<string, unknown> = {};

/**
 * The most one socket pair on this machine can hold in flight: the kernel's largest TCP receive
 * buffer (autotuned up to `tcp_rmem`'s maximum; 32 MiB on some kernels) and send buffer. Where
 * /proc says nothing, Linux's usual maxima (6 MiB, 4 MiB).
 */
function socketBufferBytes(): number {
  const largest = (file: string, fallback: number) => {
    try {
      const max = Number(readFileSync(file, "utf8").trim().split(/\s+/).at(-1));
      return Number.isFinite(max) && max > 0 ? max : fallback;
    } catch {
      return fallback;
    }
  };
  return (
    largest("/proc/sys/net/ipv4/tcp_rmem", 6 * 1024 * 1024) +
    largest("/proc/sys/net/ipv4/tcp_wmem", 4 * 1024 * 1024)
  );
}

/** What a client may get written before the server cuts a body off: the body limit plus the socket buffers, and 1 MiB to spare. */
const CUT_OFF_BOUND_BYTES = DEFAULT_BODY_LIMIT_BYTES + socketBufferBytes() + 1024 * 1024;
after(async () => {
  await recordFigures("security", figures);
});

describe("API keys are compared in constant time", () => {
  test("the implementation compares SHA-256 digests with timingSafeEqual and never stops early", () => {
    const source = readFileSync(join(ROOT, "adapters", "http", "api-keys.ts"), "utf8");
    assert.match(source, /import \{[^}]*createHash[^}]*timingSafeEqual[^}]*\} from "node:crypto"/);
    const lookup = /lookup\(presented: string\)[^{]*\{([\s\S]*?)\n {2}\}/.exec(source)?.[1] ?? "";
    assert.match(lookup, /digestOf\(presented\)/, "the presented key is hashed before comparing");
    assert.match(
      lookup,
      /timingSafeEqual\(slot\.digest, digest\)/,
      "digests are compared with timingSafeEqual",
    );
    assert.doesNotMatch(
      lookup,
      /\b(return|break)\b[^;]*;\s*\n\s*\}\s*\n\s*return/,
      "no early exit inside the loop",
    );
    assert.doesNotMatch(
      lookup,
      /===|!==|\.equals\(|startsWith|indexOf|includes/,
      "no ordinary comparison of key text",
    );
    const app = readFileSync(join(ROOT, "adapters", "http", "app.ts"), "utf8");
    assert.doesNotMatch(app, /adminKey\s*===|===\s*adminKey/, "the admin key is never compared with ===");
    assert.match(app, /secretsEqual\(presented, adminKey\)/);
  });

  test("only the exact key matches: prefixes, extensions, near misses and other lengths do not", () => {
    const keys = new ApiKeys({
      [USER_KEY]: { tenant: "acme", priority: 2 },
      [ADMIN_FLAGGED_KEY]: { tenant: "ops", admin: true },
    });
    assert.equal(keys.lookup(USER_KEY)?.tenant, "acme");
    assert.equal(keys.lookup(ADMIN_FLAGGED_KEY)?.admin, true);
    for (const wrong of [...WRONG_KEYS, "", "s", USER_KEY.toUpperCase(), ` ${USER_KEY}`]) {
      assert.equal(keys.lookup(wrong), undefined, `"${wrong}" must not match`);
    }
    assert.equal(secretsEqual(ADMIN_KEY, ADMIN_KEY), true);
    assert.equal(secretsEqual(ADMIN_KEY, `${ADMIN_KEY}0`), false);
    assert.equal(secretsEqual(ADMIN_KEY, ""), false);
  });
});

describe("priority and tenant come from the key only", () => {
  test("x-sluice-priority, x-sluice-tenant and friends are ignored; the key's values reach the scheduler", async () => {
    const clock = new VirtualClock();
    const engine = new SimEngine({ id: "sim-0", clock, preset: { base: "instant" } });
    const scheduler = new Scheduler({ engines: [engine], clock, tokenizer: createTokenizer() });
    scheduler.start();
    const seen: CallRequest[] = [];
    // The app sees the real scheduler; only `submit` is watched.
    const watched = new Proxy(scheduler, {
      get(target, property) {
        if (property === "submit") {
          return (req: CallRequest) => {
            seen.push(req);
            return target.submit(req);
          };
        }
        const value = Reflect.get(target, property, target) as unknown;
        return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
      },
    });
    const keys = new ApiKeys(
      { [USER_KEY]: { tenant: "acme", priority: 3 }, "sk-low-000000001": { tenant: "low" } },
      { clock },
    );
    const app = createApp({ scheduler: watched, keys, registry: new Registry() });
    const model = scheduler.models()[0]!;
    const drive = async <T>(promise: Promise<T>): Promise<T> => {
      let done = false;
      void promise.finally(() => {
        done = true;
      });
      await clock.runAsyncUntil(() => done, 100_000);
      return promise;
    };
    const hostileHeaders = {
      "content-type": "application/json",
      "x-sluice-priority": "999",
      "x-priority": "999",
      priority: "u=0",
      "x-sluice-tenant": "root",
      "x-tenant": "root",
      "x-sluice-admin": "true",
    };
    const body = JSON.stringify({
      model,
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
      priority: 999,
      tenant: "root",
      user: "root",
    });
    for (const [key, tenant, priority] of [
      [USER_KEY, "acme", 3],
      ["sk-low-000000001", "low", 0],
    ] as const) {
      const response = await drive(
        Promise.resolve(
          app.request("/v1/chat/completions", {
            method: "POST",
            body,
            headers: { ...hostileHeaders, authorization: `Bearer ${key}` },
          }),
        ),
      );
      assert.equal(response.status, 200, await response.clone().text());
      await drive(response.text());
      const req = seen.at(-1)!;
      assert.equal(req.priority, priority, "priority is the key's");
      assert.equal(req.tenant, tenant, "tenant is the key's");
    }
    // The body's own "priority" travels to the engine untouched (an engine option), but never into scheduling.
    assert.equal(seen.length, 2);
    await scheduler.stop();
    assertQuiescent(scheduler);
  });
});

describe("a served process: keys, admin routes, request ids, limits, CORS", () => {
  let serve: SluiceChild | undefined;
  let url = "";
  let port = 0;
  let dir = "";

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "sluice-security-"));
    const keyFile = join(dir, "keys.json");
    writeFileSync(
      keyFile,
      JSON.stringify({
        [USER_KEY]: { tenant: "acme", priority: 1 },
        [ADMIN_FLAGGED_KEY]: { tenant: "ops", admin: true },
      }),
    );
    serve = spawnSluice([
      "serve",
      "--port",
      "0",
      "--host",
      "127.0.0.1",
      "--sim-replicas",
      "1",
      "--api-keys",
      keyFile,
      "--admin-key",
      ADMIN_KEY,
      "--drain-timeout-ms",
      "2000",
    ]);
    const match = await serve.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    port = Number(match[1]);
    url = `http://127.0.0.1:${port}`;
  });

  after(async () => {
    await stopChild(serve);
    rmSync(dir, { recursive: true, force: true });
  });

  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body),
    });
  const chatBody = { messages: [{ role: "user", content: "hello" }], max_tokens: 3 };

  test("every /v1 route needs a key; admin routes need the admin key or an admin-flagged key", async () => {
    const get = (path: string, key?: string) =>
      fetch(`${url}${path}`, key ? { headers: { authorization: `Bearer ${key}` } } : {});
    for (const path of ["/v1/admin/state", "/dashboard"]) {
      for (const key of [undefined, ...WRONG_KEYS]) {
        const response = await get(path, key);
        checkRefusal(response.status, response.headers, await response.text(), {
          context: `${path} with ${key}`,
        });
        assert.equal(response.status, 401, `${path} with ${key ?? "no key"}`);
      }
      // A known key without the admin right is forbidden, not unauthenticated.
      const user = await get(path, USER_KEY);
      assert.equal(user.status, 403, `${path} with a user key`);
      checkRefusal(user.status, user.headers, await user.text(), { context: `${path} with a user key` });
      for (const key of [ADMIN_KEY, ADMIN_FLAGGED_KEY]) {
        const response = await get(path, key);
        assert.equal(response.status, 200, `${path} with an admin credential`);
        await response.text();
      }
    }
    const page = await fetch(`${url}/dashboard?key=${ADMIN_KEY}`);
    assert.equal(page.status, 200, "the dashboard takes ?key= (a browser cannot set headers)");
    await page.text();
    for (const path of ["/v1/models", "/v1/sessions/s-1"]) {
      const none = await get(path);
      assert.equal(none.status, 401);
      await none.text();
      const wrong = await get(path, WRONG_KEYS[0]);
      assert.equal(wrong.status, 401);
      await wrong.text();
    }
    const call = await post("/v1/chat/completions", chatBody, { authorization: `Bearer ${USER_KEY}` });
    assert.equal(call.status, 200);
    await call.text();
    const anonymous = await post("/v1/chat/completions", chatBody);
    assert.equal(anonymous.status, 401);
    const refusal = await anonymous.text();
    checkRefusal(401, anonymous.headers, refusal);
    const health = await fetch(`${url}/healthz`);
    assert.equal(health.status, 200, "liveness needs no key");
    await health.text();
  });

  test("request ids are echoed only when printable ASCII of at most 128 characters; CRLF never injects a header", async () => {
    const auth = { authorization: `Bearer ${USER_KEY}` };
    const cases: [string, boolean][] = [
      ["plain-id-123", true],
      ["x".repeat(128), true],
      ["x".repeat(129), false],
      ["tab\there", false],
      ["bell\u0007", false],
      ["del\u007f", false],
      ["caf\u00e9", false],
    ];
    for (const [id, echoed] of cases) {
      // Bytes above 0x7f travel as latin1, which fetch cannot send: use the raw socket for every case.
      const body = JSON.stringify(chatBody);
      const head =
        `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: ${auth.authorization}\r\n` +
        `content-type: application/json\r\nx-request-id: ${id}\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n`;
      const exchange = await rawHttp(port, Buffer.from(head + body, "latin1"));
      assert.ok(
        exchange.status === 200 || exchange.status === 400,
        `${JSON.stringify(id)}: ${exchange.raw.slice(0, 200)}`,
      );
      const returned = exchange.headers["x-request-id"];
      if (echoed) assert.equal(returned, id);
      else if (exchange.status !== 400)
        assert.match(returned ?? "", /^req-[0-9a-f-]{36}$/, `${JSON.stringify(id)} is replaced`);
    }
    for (const injection of ["a\r\nx-injected: 1", "a\rb", "a\nx-injected: 1", "a\u0000b"]) {
      const head = `GET /healthz HTTP/1.1\r\nhost: x\r\nx-request-id: ${injection}\r\nconnection: close\r\n\r\n`;
      const exchange = await rawHttp(port, Buffer.from(head, "latin1"));
      assert.ok(!("x-injected" in exchange.headers), "no header injected through a request id");
      if (exchange.status !== 0) {
        if (exchange.status >= 400)
          checkRefusal(exchange.status, exchange.headers, exchange.body, { transport: true });
        const returned = exchange.headers["x-request-id"];
        if (returned !== undefined)
          assert.ok(/^[\x20-\x7e]{1,128}$/.test(returned) && !returned.includes("\r"));
      }
    }
  });

  test("oversized bodies are cut off unread: declared, chunked without a length, and lying about their length", async () => {
    const total = 100 * 1024 * 1024;
    assert.ok(
      CUT_OFF_BOUND_BYTES < total / 2,
      `the bound (${CUT_OFF_BOUND_BYTES}) still tells a cut-off body`,
    );
    const piece = Buffer.alloc(64 * 1024, 0x61);
    const upload = function* (chunked: boolean) {
      for (let sent = 0; sent < total; sent += piece.length) {
        yield chunked
          ? Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from("\r\n")])
          : piece;
      }
    };
    const base = `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${USER_KEY}\r\ncontent-type: application/json\r\n`;
    const declared = await rawHttp(port, `${base}content-length: ${total}\r\n\r\n`, {
      body: () => upload(false),
      timeoutMs: 10_000,
    });
    const chunked = await rawHttp(port, `${base}transfer-encoding: chunked\r\n\r\n`, {
      body: () => upload(true),
      timeoutMs: 10_000,
    });
    const lying = await rawHttp(port, `${base}content-length: 64\r\n\r\n`, {
      body: () => upload(false),
      timeoutMs: 10_000,
    });
    const measured: Record<string, number> = {};
    for (const [name, exchange, status] of [
      ["declared 100 MiB", declared, 413],
      ["chunked 100 MiB, no length", chunked, 413],
      ["lying length 64, sends 100 MiB", lying, 400],
    ] as const) {
      assert.equal(exchange.status, status, `${name}: ${exchange.raw.slice(0, 200)}`);
      checkRefusal(exchange.status, exchange.headers, exchange.body, { context: name, transport: true });
      assert.ok(exchange.closed, `${name}: the server closes the connection instead of reading the rest`);
      // What the client could write bounds what the server read: the limit plus what the kernel's
      // socket buffers hold, far from 100 MiB.
      assert.ok(
        exchange.bytesWritten < CUT_OFF_BOUND_BYTES,
        `${name}: ${exchange.bytesWritten} bytes went in (bound ${CUT_OFF_BOUND_BYTES})`,
      );
      measured[name] = exchange.bytesWritten;
    }
    figures.bodyCutOffBytesWritten = measured;
    const header = await rawHttp(
      port,
      `GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: ${"p".repeat(64 * 1024)}\r\n\r\n`,
    );
    assert.equal(header.status, 431, "oversized headers are refused by the parser");
    checkRefusal(431, header.headers, header.body, { transport: true });
  });

  test("pathological prompts are refused with a bounded amount of tokenizer work", async () => {
    // Runs of one character make BPE quadratic; whole, 4 MiB of them would hold the server for minutes.
    const auth = { authorization: `Bearer ${USER_KEY}` };
    for (const content of [
      "é".repeat(2_000_000),
      "a".repeat(4_000_000),
      " ".repeat(4_000_000),
      "漢".repeat(1_300_000),
    ]) {
      const response = await post(
        "/v1/chat/completions",
        { messages: [{ role: "user", content }], max_tokens: 4 },
        auth,
      );
      const text = await response.text();
      assert.ok(
        response.status === 413 || response.status === 200,
        `${response.status}: ${text.slice(0, 200)}`,
      );
      if (response.status === 413) assert.equal(checkRefusal(413, response.headers, text), "context_limit");
      const completion = await post("/v1/completions", { prompt: content, max_tokens: 4 }, auth);
      const completionText = await completion.text();
      assert.ok(
        completion.status === 413 || completion.status === 200,
        `${completion.status}: ${completionText.slice(0, 200)}`,
      );
    }
    // Brackets inside strings are text, not nesting: the depth limit must not refuse them.
    const brackets = await post(
      "/v1/chat/completions",
      { messages: [{ role: "user", content: `${"[{".repeat(2000)} " ]}]} \\` }], max_tokens: 2 },
      auth,
    );
    assert.equal(brackets.status, 200, await brackets.text());
    const deep = await post(
      "/v1/chat/completions",
      {
        messages: [
          { role: "user", content: "hi", tool_calls: JSON.parse(`${"[".repeat(200)}${"]".repeat(200)}`) },
        ],
        max_tokens: 2,
      },
      auth,
    );
    const deepText = await deep.text();
    assert.equal(deep.status, 400, deepText);
    assert.match(deepText, /deeper than 128 levels/);
    // The work itself, counted: no piece holds a longer run, and a limit stops the count early.
    const prompts = new PromptTokenizer(createTokenizer());
    for (const text of ["a".repeat(1_000_000), "é".repeat(500_000), " ".repeat(500_000)]) {
      for (const piece of splitLongRuns(text)) assert.ok(piece.length <= MAX_PIECE_RUN + 1);
      prompts.resetStats();
      const tokens = prompts.text(text, 1000);
      assert.ok(tokens.length > 1000 || tokens.length === prompts.text(text).length);
      prompts.resetStats();
      prompts.text(text, 1000);
      assert.ok(
        prompts.stats().tokenizedTokens <= 1000 + MAX_PIECE_RUN,
        `${prompts.stats().tokenizedTokens} tokens counted`,
      );
    }
    // Ordinary text is tokenized whole, so its count is exact.
    const tokenizer = createTokenizer();
    const prose = "The quick brown fox jumps over the lazy dog 42 times. ".repeat(5000);
    assert.deepEqual(prompts.text(prose), tokenizer.encode(prose));
    const base64 = Buffer.from(Array.from({ length: 60_000 }, (_, i) => (i * 7919) % 256)).toString("base64");
    assert.deepEqual(
      prompts.text(base64),
      tokenizer.encode(base64),
      "cuts at letter–digit boundaries keep the count",
    );
  });

  test("no CORS headers unless configured", async () => {
    const preflight = await fetch(`${url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: {
        origin: "https://evil.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
      },
    });
    await preflight.text();
    const simple = await fetch(`${url}/v1/models`, {
      headers: { origin: "https://evil.example", authorization: `Bearer ${USER_KEY}` },
    });
    await simple.text();
    for (const response of [preflight, simple]) {
      response.headers.forEach((_, name) => {
        assert.ok(!name.startsWith("access-control-"), `unexpected ${name}`);
      });
    }
  });

  test("no key ever reaches the log, the metrics, the admin state or an error body; the process drains and exits 0", async () => {
    const auth = (key: string) => ({ authorization: `Bearer ${key}` });
    const bodies: string[] = [];
    for (const key of [...WRONG_KEYS, USER_KEY]) {
      const response = await post("/v1/chat/completions", chatBody, auth(key));
      bodies.push(await response.text());
    }
    for (const path of ["/metrics", "/v1/admin/state", `/dashboard?key=${ADMIN_KEY}`]) {
      const response = await fetch(`${url}${path}`, { headers: auth(ADMIN_KEY) });
      const text = await response.text();
      if (!path.startsWith("/dashboard")) bodies.push(text);
    }
    const wrongAdmin = await fetch(`${url}/v1/admin/state`, { headers: auth(`${ADMIN_KEY}1`) });
    bodies.push(await wrongAdmin.text());
    serve!.child.kill("SIGTERM");
    const exit = await serve!.exited;
    assert.equal(exit.code, 0, serve!.output());
    const log = serve!.output();
    assert.match(log, /stopped \(permits 0, reservations 0, window slots 0, queued 0\)/, log);
    for (const secret of [USER_KEY, ADMIN_FLAGGED_KEY, ADMIN_KEY, ...WRONG_KEYS, `${ADMIN_KEY}1`]) {
      assert.ok(!log.includes(secret), `the log holds a key: ${secret}`);
      // A distinctive middle part catches a key logged in pieces or quoted.
      assert.ok(!log.includes(secret.slice(4, 16)), `the log holds part of a key: ${secret}`);
      for (const body of bodies) assert.ok(!body.includes(secret), `a response body holds a key: ${secret}`);
    }
    figures.logBytesChecked = log.length;
    serve = undefined;
  });
});

describe("CORS when configured", () => {
  let server: RunningServer | undefined;
  after(async () => {
    await server?.close();
  });

  test("only the configured origin is allowed", async () => {
    server = await startServer({
      port: await freePort(),
      host: "127.0.0.1",
      simReplicas: 1,
      simPreset: "instant",
      corsOrigins: ["https://app.example"],
      log: () => {},
    });
    const allowed = await fetch(`${server.url}/v1/models`, { headers: { origin: "https://app.example" } });
    await allowed.text();
    assert.equal(allowed.headers.get("access-control-allow-origin"), "https://app.example");
    const other = await fetch(`${server.url}/v1/models`, { headers: { origin: "https://evil.example" } });
    await other.text();
    assert.notEqual(other.headers.get("access-control-allow-origin"), "https://evil.example");
    assert.notEqual(other.headers.get("access-control-allow-origin"), "*");
  });
});
