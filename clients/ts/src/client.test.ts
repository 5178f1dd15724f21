// The TypeScript host client against a real psych-sidecar process
// ($PSYCH_SIDECAR_BIN, or psych-sidecar on PATH). A response is lost by
// holding the sidecar's SQLite write lock with
// clients/testing/hold-sqlite-write-lock (python3, or $PYTHON).

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";

import { type Record, RecordSchema } from "./proto/psych/sidecar/v1/run_pb.js";
import type { AppendRecordsRequest } from "./proto/psych/sidecar/v1/run_service_pb.js";

import { Provider } from "./proto/psych/sidecar/v1/content_pb.js";

import {
  ErrorReason,
  type SidecarClient,
  SidecarError,
  anthropicRecord,
  connect,
  geminiRecord,
  openaiRecord,
  requestBody,
} from "./index.js";
import {
  ANTHROPIC_REDACTED,
  ANTHROPIC_RESPONSE,
  ANTHROPIC_THINKING,
  GEMINI_RESPONSE,
  GEMINI_SIGNED,
  GEMINI_THOUGHT,
  OPENAI_CALL,
  OPENAI_REASONING,
  OPENAI_RESPONSE,
} from "./recorded_responses.test.js";
import { thinkingTurn } from "./thinking_loop.test.js";

const HOLD_WRITE_LOCK = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "testing", "hold-sqlite-write-lock");

// --- the sidecar process ---------------------------------------------------------

interface Sidecar {
  unix: string;
  tcp: string;
  database: string;
  stop: () => Promise<void>;
}

async function freeLoopbackPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((done) => server.close(() => done()));
  return port;
}

async function startSidecar(): Promise<Sidecar> {
  const bin = process.env.PSYCH_SIDECAR_BIN || "psych-sidecar";
  const dir = mkdtempSync(join(tmpdir(), "pscl")); // short: socket paths are limited to ~107 bytes
  const unix = `unix://${join(dir, "s.sock")}`;
  const tcp = `127.0.0.1:${await freeLoopbackPort()}`;
  const database = join(dir, "db.sqlite3");
  const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("PSYCH_SIDECAR_")));
  const proc = spawn(
    bin,
    ["serve", "--listen", unix, "--listen", tcp, "--database-url", `sqlite:///${database}`, "--data-dir", dir],
    { stdio: ["ignore", "pipe", "pipe"], env },
  );
  let output = "";
  proc.stdout.on("data", (chunk: Buffer) => (output += chunk.toString()));
  proc.stderr.on("data", (chunk: Buffer) => (output += chunk.toString()));
  const exited = new Promise<number | null>((done) => {
    proc.on("exit", (code) => done(code));
    proc.on("error", (error) => {
      output += `cannot run ${bin} (set PSYCH_SIDECAR_BIN): ${error.message}`;
      done(null);
    });
  });
  const stop = async () => {
    proc.kill("SIGTERM");
    const code = await Promise.race([exited, sleep(30_000, "timeout", { ref: false })]);
    if (code === "timeout") proc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
    if (code !== 0) throw new Error(`sidecar exit ${code} after SIGTERM\n${output}`);
  };
  // The client's own connect() waits for readiness once the socket file is there (connect
  // says at once that a socket is missing).
  for (const until = Date.now() + 30_000; !existsSync(join(dir, "s.sock")) && Date.now() < until; ) {
    await sleep(50);
  }
  try {
    (await connect(unix, { readyTimeoutMs: 30_000 })).close();
  } catch (error) {
    proc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`${(error as Error).message}\n${output}`);
  }
  return { unix, tcp, database, stop };
}

// --- helpers -------------------------------------------------------------------------

let specNumber = 0;

async function newRun(client: SidecarClient): Promise<string> {
  const name = `agent-${process.pid}-${++specNumber}`;
  await client.specs.publishSpec({ spec: { name, version: 1n } });
  const created = await client.runs.createRun({ tenant: "t", specName: name, specVersion: 1n });
  return created.run?.runId ?? assert.fail("CreateRun returned no run");
}

function user(text: string) {
  return { kind: { case: "userMessage" as const, value: { content: [{ kind: { case: "text" as const, value: text } }] } } };
}

function toolResult(callId: string, text: string) {
  return {
    kind: {
      case: "toolResult" as const,
      value: { callId, content: [{ kind: { case: "text" as const, value: text } }] },
    },
  };
}

async function stored(client: SidecarClient, runId: string): Promise<Record[]> {
  return (await client.runs.listRecords({ runId, pageSize: 1000 })).records;
}

/** Holds the sidecar's SQLite write lock: its appends wait until release(). */
class WriteLock {
  private released: Promise<void> | undefined;

  private constructor(private readonly proc: ChildProcess) {}

  static async hold(database: string): Promise<WriteLock> {
    const proc = spawn(process.env.PYTHON || "python3", [HOLD_WRITE_LOCK, database], {
      stdio: ["pipe", "pipe", "inherit"],
    });
    const lines = createInterface({ input: proc.stdout! });
    const { value: line } = await lines[Symbol.asyncIterator]().next();
    lines.close();
    assert.equal(line, "locked", "hold-sqlite-write-lock did not take the lock");
    return new WriteLock(proc);
  }

  release(): Promise<void> {
    this.released ??= new Promise<void>((done) => {
      this.proc.on("exit", () => done());
      this.proc.stdin!.end();
    });
    return this.released;
  }
}

interface Attempt {
  requestId: string;
  code: Code | "OK";
}

/**
 * Records every AppendRecords attempt, and releases `lock` (when set) once the
 * first has failed with DeadlineExceeded: that response is lost, the append
 * then completes in the sidecar, and the retry must find it.
 */
class AppendAttempts {
  lock: WriteLock | undefined;
  readonly attempts: Attempt[] = [];
  readonly interceptor: Interceptor = (next) => async (request) => {
    if (request.method.name !== "AppendRecords") return next(request);
    const requestId = (request.message as AppendRecordsRequest).requestId;
    try {
      const response = await next(request);
      this.attempts.push({ requestId, code: "OK" });
      return response;
    } catch (error) {
      const code = ConnectError.from(error).code;
      this.attempts.push({ requestId, code });
      if (code === Code.DeadlineExceeded) await this.lock?.release();
      throw error;
    }
  };
}

async function rejection(promise: Promise<unknown>): Promise<SidecarError> {
  return promise.then(
    (value) => assert.fail(`expected a failure, got ${JSON.stringify(value, (_, v) => (typeof v === "bigint" ? `${v}` : v))}`),
    (error: unknown) => {
      assert.ok(error instanceof SidecarError, `not a SidecarError: ${error}`);
      return error;
    },
  );
}

// --- tests ---------------------------------------------------------------------------

test("the TypeScript host client against a sidecar process", async (t) => {
  const sidecar = await startSidecar();
  const locks: WriteLock[] = [];
  const holdWriteLock = async () => {
    locks.push(await WriteLock.hold(sidecar.database));
    return locks[locks.length - 1];
  };
  const clients: SidecarClient[] = [];
  const open = async (...args: Parameters<typeof connect>) => {
    clients.push(await connect(...args));
    return clients[clients.length - 1];
  };
  // Each subtest's write lock is released when it ends, whatever happened.
  const subtest = (name: string, body: () => Promise<void>) =>
    t.test(name, async () => {
      try {
        await body();
      } finally {
        await Promise.all(locks.splice(0).map((lock) => lock.release()));
      }
    });
  try {
    await subtest("connect dials a Unix socket or a TCP address", async () => {
      for (const address of [sidecar.unix, sidecar.tcp]) {
        const client = await open(address, { readyTimeoutMs: 5000 });
        const runId = await newRun(client);
        assert.equal((await client.runs.getRun({ runId })).run?.runId, runId, address);
      }
    });

    await subtest("connect gives up after the ready timeout", async () => {
      // A socket nobody answers on (it accepts, and never speaks): connect waits, then gives up.
      const dir = mkdtempSync(join(tmpdir(), "pscl"));
      const silent = net.createServer(() => {});
      await new Promise<void>((done) => silent.listen(join(dir, "nobody.sock"), done));
      try {
        await assert.rejects(connect(`unix://${join(dir, "nobody.sock")}`, { readyTimeoutMs: 500 }), /not SERVING within 500 ms/);
      } finally {
        silent.close();
        rmSync(dir, { recursive: true, force: true });
      }
    });

    // Before: 20 s of retries, then "not SERVING (Unavailable)", the path never named. The
    // ready timeout here is an hour: only an answer at once passes.
    await subtest("connect names a missing socket at once", async () => {
      const dir = mkdtempSync(join(tmpdir(), "pscl"));
      const path = join(dir, "nobody.sock");
      try {
        await assert.rejects(connect(`unix://${path}`, { readyTimeoutMs: 3_600_000 }), {
          message: `no socket at ${path} (from unix://${path}): is the sidecar running, and listening there?`,
          code: "ENOENT",
        });
        const relative = "unix:psych-sidecar-data/sidecar.sock";
        await assert.rejects(connect(relative, { readyTimeoutMs: 3_600_000 }), (error: Error) =>
          error.message.startsWith(`no socket at ${resolve("psych-sidecar-data/sidecar.sock")} (from ${relative}): `),
        );
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    await subtest("connect says at once what is wrong with an address", async () => {
      const dir = mkdtempSync(join(tmpdir(), "pscl"));
      const notSocket = join(dir, "sidecar.sock");
      writeFileSync(notSocket, "");
      try {
        for (const [address, message] of [
          ["", "no sidecar address: give the one scripts/serve prints"],
          ["/run/psych/sidecar.sock", "/run/psych/sidecar.sock is a socket path without unix: in front: write unix:/run/psych/sidecar.sock"],
          ["psych-sidecar-data/sidecar.sock", "write unix:psych-sidecar-data/sidecar.sock"],
          [`unix:${notSocket}`, `${notSocket} (from unix:${notSocket}) is not a socket`],
        ]) {
          await assert.rejects(connect(address, { readyTimeoutMs: 3_600_000 }), (error: Error) => error.message.includes(message));
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    await subtest("an ErrorInfo becomes an ErrorReason to switch on", async () => {
      const client = await open(sidecar.unix);
      const error = await rejection(client.runs.getRun({ runId: "run_nope" }));
      assert.equal(error.reason, ErrorReason.RUN_NOT_FOUND);
      assert.equal(error.reasonName, "RUN_NOT_FOUND");
      assert.equal(error.code, Code.NotFound);
      assert.deepEqual(error.metadata, { run_id: "run_nope" });
      const missing = await rejection(client.runs.createRun({ specName: "x" }));
      assert.equal(missing.reason, ErrorReason.FIELD_REQUIRED);
      assert.equal(missing.metadata.field, "tenant");
    });

    await subtest("every call has a deadline", async () => {
      const client = await open(sidecar.unix, { callTimeoutMs: 500 });
      const runId = await newRun(client);
      await holdWriteLock();
      const error = await rejection(client.runs.appendRecords({ runId, records: [user("hi")] }));
      assert.equal(error.code, Code.DeadlineExceeded);
      // gRPC's own failure: no ErrorInfo, so no reason.
      assert.equal(error.reason, ErrorReason.UNSPECIFIED);
    });

    await subtest("a lost append response is retried with its request id and stored once", async () => {
      const spy = new AppendAttempts();
      const client = await open(sidecar.unix, { callTimeoutMs: 1000, appendAttempts: 5, interceptors: [spy.interceptor] });
      const runId = await newRun(client);
      spy.lock = await holdWriteLock();
      const request = { runId, requestId: "turn-1", records: [user("hi"), toolResult("c1", "ok")] };
      const answer = await client.appendRecords(request);
      assert.ok(spy.attempts.length >= 2, JSON.stringify(spy.attempts));
      assert.equal(spy.attempts[0].code, Code.DeadlineExceeded);
      assert.equal(spy.attempts[spy.attempts.length - 1].code, "OK");
      assert.deepEqual(new Set(spy.attempts.map((a) => a.requestId)), new Set(["turn-1"]));
      assert.deepEqual(answer.records.map((r) => r.sequence), [1n, 2n]);
      assert.notEqual(answer.records[1].handle, "");
      const records = await stored(client, runId);
      assert.deepEqual(records.map((r) => r.sequence), [1n, 2n]);
      assert.equal(records[1].handle, answer.records[1].handle);
      const again = await client.appendRecords(request);
      assert.deepEqual(again.records.map((r) => [r.sequence, r.handle]), answer.records.map((r) => [r.sequence, r.handle]));
      assert.equal((await stored(client, runId)).length, 2);
    });

    await subtest("a request without an id gets one that every attempt reuses", async () => {
      const spy = new AppendAttempts();
      const client = await open(sidecar.unix, { callTimeoutMs: 1000, appendAttempts: 5, interceptors: [spy.interceptor] });
      const runId = await newRun(client);
      spy.lock = await holdWriteLock();
      const request = { runId, records: [user("hi")] };
      const answer = await client.appendRecords(request);
      assert.ok(spy.attempts.length >= 2, JSON.stringify(spy.attempts));
      const ids = new Set(spy.attempts.map((a) => a.requestId));
      assert.equal(ids.size, 1);
      assert.ok(!ids.has(""));
      assert.equal("requestId" in request, false, "the caller's request was changed");
      assert.deepEqual(answer.records.map((r) => r.sequence), [1n]);
      assert.equal((await stored(client, runId)).length, 1);
    });

    await subtest("append retries are bounded and never store twice", async () => {
      const spy = new AppendAttempts();
      const client = await open(sidecar.unix, { callTimeoutMs: 300, appendAttempts: 3, interceptors: [spy.interceptor] });
      const runId = await newRun(client);
      const lock = await holdWriteLock();
      const request = { runId, requestId: "turn-1", records: [user("hi")] };
      const error = await rejection(client.appendRecords(request));
      assert.equal(error.code, Code.DeadlineExceeded);
      assert.deepEqual(spy.attempts, Array(3).fill({ requestId: "turn-1", code: Code.DeadlineExceeded }));
      // Three abandoned attempts are still waiting in the sidecar; they store once.
      await lock.release();
      const answer = await client.appendRecords(request);
      assert.deepEqual(answer.records.map((r) => r.sequence), [1n]);
      assert.deepEqual((await stored(client, runId)).map((r) => r.sequence), [1n]);
    });

    await subtest("an error the sidecar answered is not retried", async () => {
      const spy = new AppendAttempts();
      const client = await open(sidecar.unix, { appendAttempts: 5, interceptors: [spy.interceptor] });
      const error = await rejection(client.appendRecords({ runId: "run_nope", requestId: "turn-1", records: [user("hi")] }));
      assert.equal(error.reason, ErrorReason.RUN_NOT_FOUND);
      assert.equal(spy.attempts.length, 1);
    });

    await subtest("each provider's blocks go back in its own body byte for byte", async () => {
      const client = await open(sidecar.unix);
      const cases: [Record, Provider, string[]][] = [
        [anthropicRecord(ANTHROPIC_RESPONSE), Provider.ANTHROPIC, [ANTHROPIC_THINKING, ANTHROPIC_REDACTED]],
        [openaiRecord(OPENAI_RESPONSE), Provider.OPENAI, [OPENAI_REASONING, OPENAI_CALL]],
        [geminiRecord(GEMINI_RESPONSE, ["g1", "g2"]), Provider.GEMINI, [GEMINI_THOUGHT, GEMINI_SIGNED]],
      ];
      for (const [record, provider, sent] of cases) {
        const runId = await newRun(client);
        const calls = record.kind.case === "assistantMessage" ? record.kind.value.toolCalls : [];
        await client.appendRecords({
          runId,
          records: [user("Weather?"), record, ...calls.map((call) => toolResult(call.callId, "18 C"))],
        });
        const assembled = await client.turns.assemblePrompt({ runId });
        const body = new TextDecoder().decode(requestBody(assembled, provider));
        JSON.parse(body);
        // Each as the response had it, in the response's order.
        let at = 0;
        for (const block of sent) {
          const found = body.indexOf(block, at);
          assert.ok(found >= 0, `the ${Provider[provider]} body lacks ${block} after ${at}: ${body}`);
          at = found + block.length;
        }
        // Never in another provider's body, nor in Chat Completions'.
        for (const other of [Provider.ANTHROPIC, Provider.OPENAI, Provider.GEMINI].filter((p) => p !== provider)) {
          assert.ok(!new TextDecoder().decode(requestBody(assembled, other)).includes(sent[0]), Provider[other]);
        }
        assert.ok(!new TextDecoder().decode(assembled.openaiRequestJson).includes(sent[0]));
      }
    });

    await subtest("the README's thinking loop sends each thinking block back as it came", async () => {
      const client = await open(sidecar.unix);
      const thinking = '{"type":"thinking","thinking":"Look the order up.","signature":"EqQBCgIY"}';
      const responses = [
        `{"content":[${thinking},{"type":"tool_use","id":"toolu_1","name":"find_order","input":{"n":7}}]}`,
        '{"content":[{"type":"thinking","thinking":"Done.","signature":"Ev4B"},{"type":"text","text":"It ships tomorrow."}]}',
      ];
      const sent: string[] = [];
      await thinkingTurn(
        client,
        async (body) => {
          sent.push(new TextDecoder().decode(body));
          return responses[sent.length - 1];
        },
        async (call) => create(RecordSchema, toolResult(call.callId, "shipped")),
      );
      assert.equal(sent.length, 2);
      assert.deepEqual((JSON.parse(sent[0]) as { thinking: unknown }).thinking, { type: "enabled", budget_tokens: 4000 });
      assert.ok(sent[1].includes(`{"role":"assistant","content":[${thinking},{"type":"tool_use"`), sent[1]);
    });
  } finally {
    clients.forEach((client) => client.close());
    await sidecar.stop();
  }
});
