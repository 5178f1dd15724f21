// Drives a real psych-sidecar process from TypeScript through the generated
// contract that @psych-sidecar/client ships (installed from its npm pack
// tarball), the way a Node agent host would: gRPC over HTTP/2 on the sidecar's
// Unix socket (Connect's gRPC transport with a custom http2 connection),
// waiting for health (the generated grpc.health.v1 client) with a bounded
// timeout, with a deadline on every call.
//
// The sidecar binary is $PSYCH_SIDECAR_BIN, or psych-sidecar on PATH.

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { test } from "node:test";

import { clone, create, equals } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, type Transport, createClient } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";

import { ErrorInfoSchema } from "@psych-sidecar/client/proto/google/rpc/error_details_pb";
import { Health, HealthCheckResponse_ServingStatus } from "@psych-sidecar/client/proto/grpc/health/v1/health_pb";
import { ErrorReasonSchema } from "@psych-sidecar/client/proto/psych/sidecar/v1/errors_pb";
import { type Record, RecordSchema } from "@psych-sidecar/client/proto/psych/sidecar/v1/run_pb";
import { RunService } from "@psych-sidecar/client/proto/psych/sidecar/v1/run_service_pb";
import { SpecService } from "@psych-sidecar/client/proto/psych/sidecar/v1/spec_service_pb";

const READY_TIMEOUT_MS = 20_000;
const CALL_TIMEOUT_MS = 10_000;
const EXIT_TIMEOUT_MS = 20_000;

// --- the sidecar process ---------------------------------------------------

interface Sidecar {
  proc: ChildProcess;
  output: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  transport: Transport;
  stop: () => Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  cleanup: () => void;
}

async function startSidecar(): Promise<Sidecar> {
  const bin = process.env.PSYCH_SIDECAR_BIN || "psych-sidecar";
  // Short path: Unix socket paths are limited to ~107 bytes.
  const dir = mkdtempSync(join(tmpdir(), "psts"));
  const socket = join(dir, "s.sock");
  const database = `sqlite:///${join(dir, "db.sqlite3")}`; // sqlite:////abs/path

  const proc = spawn(bin, ["serve", "--listen", `unix://${socket}`, "--database-url", database], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  proc.stdout?.on("data", (chunk: Buffer) => (output += chunk.toString()));
  proc.stderr?.on("data", (chunk: Buffer) => (output += chunk.toString()));
  let hasExited = false;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>(
    (resolve, reject) => {
      proc.on("error", (err) =>
        reject(new Error(`cannot run sidecar ${bin} (set PSYCH_SIDECAR_BIN): ${err.message}`)),
      );
      proc.on("exit", (code, signal) => {
        hasExited = true;
        resolve({ code, signal });
      });
    },
  );
  exited.catch(() => {}); // observed where awaited

  const sessionManager = new Http2SessionManager(
    "http://localhost",
    {},
    { createConnection: () => net.connect(socket) },
  );
  const transport = createGrpcTransport({ baseUrl: "http://localhost", sessionManager });

  const cleanup = () => {
    sessionManager.abort();
    if (!hasExited) proc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };

  const sidecar: Sidecar = {
    proc,
    output: () => output,
    exited,
    transport,
    cleanup,
    async stop() {
      proc.kill("SIGTERM");
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`sidecar still running ${EXIT_TIMEOUT_MS} ms after SIGTERM`)),
          EXIT_TIMEOUT_MS,
        );
      });
      try {
        return await Promise.race([exited, timeout]);
      } finally {
        clearTimeout(timer);
      }
    },
  };

  try {
    await waitServing(sidecar);
  } catch (err) {
    cleanup();
    throw new Error(`${(err as Error).message}\nsidecar output:\n${output}`);
  }
  return sidecar;
}

// Polls grpc.health.v1 Check(service="") until SERVING, for at most
// READY_TIMEOUT_MS, failing early if the process exits.
async function waitServing(sidecar: Sidecar): Promise<void> {
  const health = createClient(Health, sidecar.transport);
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let exit: unknown;
  sidecar.exited.then(
    (e) => (exit = e),
    (e) => (exit = e),
  );
  let last = "no answer";
  while (Date.now() < deadline) {
    if (exit !== undefined) {
      throw exit instanceof Error
        ? exit
        : new Error(`sidecar exited before it was ready: ${JSON.stringify(exit)}`);
    }
    try {
      const res = await health.check({ service: "" }, { timeoutMs: 1000 });
      if (res.status === HealthCheckResponse_ServingStatus.SERVING) return;
      last = `status ${res.status}`;
    } catch (err) {
      last = String(err);
    }
    await sleep(100);
  }
  throw new Error(`sidecar not SERVING within ${READY_TIMEOUT_MS} ms; last answer: ${last}`);
}

async function withSidecar(fn: (s: Sidecar) => Promise<void>): Promise<void> {
  const s = await startSidecar();
  try {
    await fn(s);
  } catch (err) {
    if (err instanceof Error) err.message += `\nsidecar output:\n${s.output()}`;
    throw err;
  } finally {
    s.cleanup();
  }
}

const opts = () => ({ timeoutMs: CALL_TIMEOUT_MS });

function text(value: string) {
  return { kind: { case: "text" as const, value } };
}

async function listAll(
  runs: Client<typeof RunService>,
  runId: string,
): Promise<Record[]> {
  const all: Record[] = [];
  let pageToken = "";
  for (let page = 0; page <= 100; page++) {
    const res = await runs.listRecords({ runId, pageToken }, opts());
    all.push(...res.records);
    pageToken = res.nextPageToken;
    if (pageToken === "") return all;
  }
  throw new Error("ListRecords: no last page after 100 pages");
}

// --- tests -------------------------------------------------------------------

test("round trip through the generated TypeScript package", () =>
  withSidecar(async (s) => {
    const specs = createClient(SpecService, s.transport);
    const runs = createClient(RunService, s.transport);

    const published = await specs.publishSpec(
      {
        spec: {
          name: "ts-agent",
          version: 1n,
          instructions: "You are a TypeScript host's test agent. Answer briefly.",
          thresholds: { perResultTokens: 1000n, perBatchTokens: 4000n },
        },
      },
      opts(),
    );
    assert.equal(published.spec?.name, "ts-agent");
    assert.equal(published.spec?.version, 1n);
    assert.equal(published.spec?.thresholds?.perResultTokens, 1000n);
    assert.equal(published.spec?.thresholds?.perBatchTokens, 4000n);

    const created = await runs.createRun(
      { tenant: "t1", specName: "ts-agent", specVersion: 1n },
      opts(),
    );
    const runId = created.run?.runId ?? "";
    assert.notEqual(runId, "", "CreateRun returned no run_id");

    // Every byte value, so any text/encoding mangling of binary shows.
    const png = new Uint8Array([
      0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a,
      ...Array.from({ length: 256 }, (_, i) => i),
    ]);
    const sent: Record[] = [
      create(RecordSchema, {
        kind: {
          case: "userMessage",
          value: { content: [text("What's the weather in Oslo? ☔ — naïve")] },
        },
      }),
      create(RecordSchema, {
        kind: {
          case: "assistantMessage",
          value: {
            content: [text("Let me check.")],
            toolCalls: [
              { callId: "call_1", name: "weather__forecast", argumentsJson: '{"city": "Oslo",  "days":1}' },
            ],
          },
        },
      }),
      create(RecordSchema, {
        kind: {
          case: "toolResult",
          value: {
            callId: "call_1",
            tool: "forecast",
            content: [
              text("Rain, 7 °C."),
              { kind: { case: "binary", value: { mimeType: "image/png", data: png } } },
            ],
          },
        },
      }),
    ];
    const appendRequest = { runId, requestId: "ts-append-1", records: sent };

    const first = await runs.appendRecords(appendRequest, opts());
    assert.deepEqual(
      first.records.map((r) => r.sequence),
      [1n, 2n, 3n],
    );
    assert.equal(first.records[0].handle, "");
    assert.equal(first.records[1].handle, "");
    assert.notEqual(first.records[2].handle, "", "appended tool result has no handle");

    const listed = await listAll(runs, runId);
    assert.equal(listed.length, 3);
    listed.forEach((got, i) => {
      assert.equal(got.sequence, BigInt(i + 1));
      assert.equal(got.runId, runId);
      assert.ok(got.createTime, `record ${i} has no create_time`);
      // Compare the content only: the other fields are output-only.
      const content = clone(RecordSchema, got);
      content.runId = "";
      content.sequence = 0n;
      content.createTime = undefined;
      content.handle = "";
      assert.ok(
        equals(RecordSchema, content, sent[i]),
        `record ${i} content differs:\n got ${JSON.stringify(content, replacer)}\nwant ${JSON.stringify(sent[i], replacer)}`,
      );
    });
    const toolResult = listed[2].kind.case === "toolResult" ? listed[2].kind.value : undefined;
    const binary = toolResult?.content[1]?.kind;
    if (binary?.case !== "binary") assert.fail(`tool result part 2 is ${binary?.case}, not binary`);
    assert.deepEqual(binary.value.data, png, "binary part not byte-identical");
    assert.equal(binary.value.mimeType, "image/png");
    assert.equal(listed[2].handle, first.records[2].handle);

    // A retry after a lost response: same request_id, same records.
    const retry = await runs.appendRecords(appendRequest, opts());
    assert.deepEqual(
      retry.records.map((r) => [r.sequence, r.handle]),
      first.records.map((r) => [r.sequence, r.handle]),
    );
    assert.equal((await listAll(runs, runId)).length, 3, "the retry stored records again");
    const run = (await runs.getRun({ runId }, opts())).run;
    assert.equal(run?.runId, runId);
    assert.equal(run?.tenant, "t1");

    const exit = await s.stop();
    assert.deepEqual(exit, { code: 0, signal: null }, "sidecar did not exit cleanly on SIGTERM");
  }));

test("GetRun on an unknown run is NotFound with one ErrorInfo", () =>
  withSidecar(async (s) => {
    const runs = createClient(RunService, s.transport);
    const unknown = "run_does_not_exist";
    const err = await runs.getRun({ runId: unknown }, opts()).then(
      (res) => assert.fail(`GetRun(${unknown}) answered ${JSON.stringify(res, replacer)}`),
      (e: unknown) => ConnectError.from(e),
    );
    assert.equal(err.code, Code.NotFound, `want NotFound, got ${err.message}`);
    const infos = err.findDetails(ErrorInfoSchema);
    assert.equal(infos.length, 1, `want exactly one ErrorInfo, got ${infos.length}`);
    assert.equal(err.details.length, 1, `want exactly one detail, got ${err.details.length}`);
    const [info] = infos;
    assert.equal(info.reason, "RUN_NOT_FOUND");
    assert.equal(info.domain, "psych.sidecar.v1");
    assert.equal(info.metadata.run_id, unknown);
    // The reason is an ErrorReason value's name without its prefix.
    assert.ok(
      ErrorReasonSchema.values.some((v) => v.name === `ERROR_REASON_${info.reason}`),
      `reason ${info.reason} is not in the ErrorReason catalogue`,
    );
  }));

function replacer(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") return `${value}n`;
  if (value instanceof Uint8Array) return `<${value.length} bytes>`;
  return value;
}
