// The TypeScript contract runner: every scenario of tests/contract/scenarios/
// through the generated @psych-sidecar/proto package and Connect's gRPC
// transport, against a psych-sidecar process, over a Unix socket and loopback
// TCP. The sidecar binary is $PSYCH_SIDECAR_BIN, or psych-sidecar on PATH.

import { type ChildProcess, spawn } from "node:child_process";
import { appendFileSync, existsSync, mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { basename, delimiter, dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { type DescService, type Message, fromJson, toJson } from "@bufbuild/protobuf";
import { ConnectError, type Transport, createClient } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";

import { ErrorInfoSchema } from "@psych-sidecar/proto/google/rpc/error_details_pb";
import { ConnectionService } from "@psych-sidecar/proto/psych/sidecar/v1/connection_service_pb";
import { RunService } from "@psych-sidecar/proto/psych/sidecar/v1/run_service_pb";
import { SpecService } from "@psych-sidecar/proto/psych/sidecar/v1/spec_service_pb";
import { ToolService } from "@psych-sidecar/proto/psych/sidecar/v1/tool_service_pb";
import { TurnService } from "@psych-sidecar/proto/psych/sidecar/v1/turn_service_pb";
import { UsageService } from "@psych-sidecar/proto/psych/sidecar/v1/usage_service_pb";

import {
  CALL_TIMEOUT_MS,
  CONTRACT_DIR,
  type ErrorDetail,
  type Invoke,
  type JsonObject,
  type Outcome,
  ScenarioError,
  loadScenario,
  runScenario,
  scenarioFiles,
} from "./engine.js";
import { Health, SERVING } from "./health.js";

const MAX_MESSAGE_BYTES = 1_048_576;
const READY_TIMEOUT_MS = 30_000;
const STOP_TIMEOUT_MS = 30_000;
const COUNTS_ENV = "PSYCH_CONTRACT_COUNTS";

/** Every service of the contract, by its short name. */
const SERVICES: DescService[] = [SpecService, RunService, ConnectionService, TurnService, ToolService, UsageService];

/** The canonical gRPC status names, by code number (Connect's Code numbers are gRPC's). */
const CODE_NAMES = [
  "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
  "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
  "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
  "UNAUTHENTICATED",
];

type UnaryMethod = (request: Message, options: { timeoutMs: number }) => Promise<Message>;

/** Makes a step's call through the generated service's client method. */
function invoker(transport: Transport): Invoke {
  const clients = new Map(
    SERVICES.map((service) => [service.name, { service, client: createClient(service, transport) }]),
  );
  return async (call, request) => {
    const [serviceName, methodName] = call.split(".", 2);
    const entry = clients.get(serviceName);
    if (entry === undefined) throw new ScenarioError(`no service ${serviceName} in the contract`);
    const method = entry.service.methods.find((m) => m.name === methodName);
    if (method === undefined) throw new ScenarioError(`no method ${methodName} in ${serviceName}`);
    let message: Message;
    try {
      message = fromJson(method.input, request);
    } catch (error) {
      throw new ScenarioError(`request is not a ${method.input.name}: ${(error as Error).message}`);
    }
    const unary = (entry.client as unknown as { [name: string]: UnaryMethod })[method.localName];
    try {
      const response = await unary(message, { timeoutMs: CALL_TIMEOUT_MS });
      return { response: toJson(method.output, response) as JsonObject, code: "OK", message: "", details: [] };
    } catch (error) {
      return failure(ConnectError.from(error));
    }
  };
}

function failure(error: ConnectError): Outcome {
  const infos = error.findDetails(ErrorInfoSchema);
  const details: (ErrorDetail | null)[] = infos.map((info) => ({
    reason: info.reason,
    domain: info.domain,
    metadata: { ...info.metadata },
  }));
  for (let other = infos.length; other < error.details.length; other++) details.push(null);
  return { code: CODE_NAMES[error.code] ?? `${error.code}`, message: error.rawMessage, details };
}

// --- the sidecar process -------------------------------------------------------

interface Sidecar {
  transport: Transport;
  output: () => string;
  stop: () => Promise<void>;
}

async function freeLoopbackPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * PSYCH_SIDECAR_MCP_COMMANDS for the sidecar (README.md, "MCP servers"): the project's fixture
 * server over stdio as command `fixture`, run by the python beside the sidecar's program, which
 * has `mcp` (the sidecar is an MCP client).
 */
function mcpCommands(bin: string): string {
  const program = bin.includes("/")
    ? bin
    : (process.env.PATH ?? "").split(delimiter).map((dir) => join(dir, bin)).find((path) => existsSync(path));
  const python = program === undefined ? undefined : join(dirname(program), "python");
  if (python === undefined || !existsSync(python)) {
    throw new Error(`no python beside the sidecar program ${program ?? bin} to run the MCP fixture server`);
  }
  const fixture = resolve(CONTRACT_DIR, "..", "mcp_servers", "fixture_server.py");
  return JSON.stringify({
    fixture: { argv: [python, fixture, "stdio"], allow_extra_args: true, allowed_env: ["FIXTURE_*"] },
  });
}

/** psych-sidecar serve on one transport, SQLite in a temporary directory, waited for (bounded). */
async function startSidecar(transportName: string): Promise<Sidecar> {
  const bin = process.env.PSYCH_SIDECAR_BIN || "psych-sidecar";
  const dir = mkdtempSync(join(tmpdir(), "psct")); // short: socket paths are limited to ~107 bytes
  const socket = join(dir, "s.sock");
  const port = transportName === "tcp" ? await freeLoopbackPort() : 0;
  const listen = transportName === "tcp" ? `127.0.0.1:${port}` : `unix://${socket}`;
  const env = {
    ...Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("PSYCH_SIDECAR_"))),
    PSYCH_SIDECAR_MCP_COMMANDS: mcpCommands(bin),
    // The OAuth test server of the sign-in scenarios is on loopback, over http.
    PSYCH_SIDECAR_OAUTH_ALLOW_HTTP_LOOPBACK: "true",
  };
  const proc: ChildProcess = spawn(
    bin,
    ["serve", "--listen", listen, "--database-url", `sqlite:///${join(dir, "db.sqlite3")}`,
      "--data-dir", dir, "--max-message-bytes", `${MAX_MESSAGE_BYTES}`],
    { stdio: ["ignore", "pipe", "pipe"], env },
  );
  let output = "";
  proc.stdout?.on("data", (chunk: Buffer) => (output += chunk.toString()));
  proc.stderr?.on("data", (chunk: Buffer) => (output += chunk.toString()));
  let exit: { code: number | null; signal: string | null } | Error | undefined;
  const exited = new Promise<void>((resolve) => {
    proc.on("error", (error) => {
      exit = new Error(`cannot run sidecar ${bin} (set PSYCH_SIDECAR_BIN): ${error.message}`);
      resolve();
    });
    proc.on("exit", (code, signal) => {
      exit = { code, signal };
      resolve();
    });
  });

  const baseUrl = transportName === "tcp" ? `http://127.0.0.1:${port}` : "http://localhost";
  const sessionManager = new Http2SessionManager(
    baseUrl,
    {},
    transportName === "tcp" ? undefined : { createConnection: () => net.connect(socket) },
  );
  const transport = createGrpcTransport({ baseUrl, sessionManager });
  const cleanup = () => {
    sessionManager.abort();
    if (exit === undefined) proc.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };

  const health = createClient(Health, transport);
  const deadline = Date.now() + READY_TIMEOUT_MS;
  let last = "no answer";
  for (;;) {
    if (exit !== undefined || Date.now() > deadline) {
      cleanup();
      const why = exit instanceof Error ? exit.message : exit ? `exited ${JSON.stringify(exit)}` : `not SERVING within ${READY_TIMEOUT_MS} ms (${last})`;
      throw new Error(`sidecar ${why}\n${output}`);
    }
    try {
      const response = await health.check({ service: "" }, { timeoutMs: 1000 });
      if (response.status === SERVING) break;
      last = `status ${response.status}`;
    } catch (error) {
      last = String(error);
    }
    await sleep(100);
  }

  return {
    transport,
    output: () => output,
    async stop() {
      sessionManager.abort();
      proc.kill("SIGTERM");
      const timeout = sleep(STOP_TIMEOUT_MS, "timeout", { ref: false });
      const result = await Promise.race([exited.then(() => "exited"), timeout]);
      cleanup();
      if (result !== "exited") throw new Error(`sidecar still running ${STOP_TIMEOUT_MS} ms after SIGTERM`);
      if (exit instanceof Error || exit?.code !== 0) {
        throw new Error(`sidecar did not exit cleanly on SIGTERM: ${JSON.stringify(exit)}\n${output}`);
      }
    },
  };
}

// --- the runner ------------------------------------------------------------------

const files = scenarioFiles();

for (const transportName of ["unix", "tcp"]) {
  test(`scenarios over ${transportName}`, async (t) => {
    let passed = 0;
    const sidecar = await startSidecar(transportName);
    try {
      const invoke = invoker(sidecar.transport);
      for (const file of files) {
        await t.test(basename(file, ".json"), async () => {
          try {
            await runScenario(loadScenario(file), invoke);
          } catch (error) {
            if (error instanceof Error && !(error instanceof ScenarioError)) {
              error.message += `\nsidecar output:\n${sidecar.output().slice(-4000)}`;
            }
            throw error;
          }
          // Reached only when the scenario ran to its end: a skip is not counted.
          passed++;
        });
      }
    } finally {
      await sidecar.stop();
      report(transportName, passed);
    }
  });
}

/** Prints the count of scenarios that passed over one transport, and appends it to $PSYCH_CONTRACT_COUNTS. */
function report(transportName: string, passed: number) {
  console.log(`contract: ts ran ${passed} of ${files.length} scenarios over ${transportName}`);
  const countsFile = process.env[COUNTS_ENV];
  if (countsFile) appendFileSync(countsFile, `ts ${transportName} ${passed}\n`);
}
