// A thin TypeScript host client for psych-sidecar. The package ships the
// generated contract too, which stays the contract: import its messages and
// enums from "@psych-sidecar/client/proto/psych/sidecar/v1/<file>_pb".
//
//   const sidecar = await connect("unix:///run/psych/sidecar.sock");
//   const { run } = await sidecar.runs.createRun({ tenant, specName, specVersion: 1n });
//   const appended = await sidecar.appendRecords({ runId: run!.runId, records });
//   try { ... } catch (e) {
//     if (e instanceof SidecarError && e.reason === ErrorReason.RUN_NOT_FOUND) ...
//   }
//
// connect() waits, bounded, for grpc.health.v1 to report SERVING. Every call
// gets a deadline unless it sets its own, and fails with a SidecarError whose
// reason is a generated ErrorReason value. appendRecords retries on
// UNAVAILABLE or DEADLINE_EXCEEDED with the same request id, so a lost
// response never stores twice. anthropicRecord, openaiRecord and geminiRecord
// turn a reasoning model's response into the assistant record to append, its
// thinking kept byte for byte as provider blocks; requestBody picks the body
// to send that provider.

import { randomBytes } from "node:crypto";
import { statSync } from "node:fs";
import net from "node:net";
import { dirname, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  type CallOptions,
  type Client,
  Code,
  ConnectError,
  type Interceptor,
  type Transport,
  createClient,
} from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";

import { ErrorInfoSchema } from "./proto/google/rpc/error_details_pb.js";
import { ConnectionService } from "./proto/psych/sidecar/v1/connection_service_pb.js";
import { ErrorReason } from "./proto/psych/sidecar/v1/errors_pb.js";
import {
  type AppendRecordsRequestSchema,
  type AppendRecordsResponse,
  RunService,
} from "./proto/psych/sidecar/v1/run_service_pb.js";
import { SpecService } from "./proto/psych/sidecar/v1/spec_service_pb.js";
import { ToolService } from "./proto/psych/sidecar/v1/tool_service_pb.js";
import { TurnService } from "./proto/psych/sidecar/v1/turn_service_pb.js";
import { UsageService } from "./proto/psych/sidecar/v1/usage_service_pb.js";

import { Health, HealthCheckResponse_ServingStatus } from "./proto/grpc/health/v1/health_pb.js";

export { ErrorReason };
export { type ProviderResponse, anthropicRecord, geminiRecord, openaiRecord, requestBody } from "./provider_blocks.js";

export const DEFAULT_READY_TIMEOUT_MS = 20_000;
export const DEFAULT_CALL_TIMEOUT_MS = 10_000;
export const DEFAULT_APPEND_ATTEMPTS = 3;
/** The sidecar's own default limit: prompts and tool results outgrow gRPC's 4 MiB default. */
export const DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024;
/** Failures after which an append may or may not have been stored: retried with its request id. */
export const RETRYABLE_CODES: readonly Code[] = [Code.Unavailable, Code.DeadlineExceeded];

const ERROR_DOMAIN = "psych.sidecar.v1";
const RETRY_BACKOFF_MS = 100;

export interface ConnectOptions {
  /** Bounds connect()'s wait for SERVING. */
  readyTimeoutMs?: number;
  /** The deadline of a call that sets none. */
  callTimeoutMs?: number;
  /** How many times appendRecords tries in all. */
  appendAttempts?: number;
  /** The largest message sent or received. */
  maxMessageBytes?: number;
  /** Connect interceptors for every call. */
  interceptors?: Interceptor[];
}

/**
 * A failed call. Switch on `reason`, a generated ErrorReason value: UNSPECIFIED
 * when the failure carries no ErrorInfo (gRPC's own failures: Unavailable,
 * DeadlineExceeded, ...) or a reason newer than this client's stubs
 * (`reasonName` still holds it). `cause` is Connect's error.
 */
export class SidecarError extends Error {
  override name = "SidecarError";
  override readonly cause: ConnectError;
  readonly code: Code;
  readonly reason: ErrorReason;
  readonly reasonName: string;
  /** The ErrorInfo's metadata. */
  readonly metadata: { readonly [key: string]: string };

  constructor(cause: ConnectError) {
    super(cause.message, { cause });
    this.cause = cause;
    this.code = cause.code;
    const info = cause.findDetails(ErrorInfoSchema).find((detail) => detail.domain === ERROR_DOMAIN);
    this.reasonName = info?.reason ?? "";
    const known = (ErrorReason as unknown as { [name: string]: number | string })[this.reasonName];
    this.reason = typeof known === "number" ? (known as ErrorReason) : ErrorReason.UNSPECIFIED;
    this.metadata = { ...(info?.metadata ?? {}) };
  }

  /** Any failure of a call as a SidecarError. */
  static from(error: unknown): SidecarError {
    return error instanceof SidecarError ? error : new SidecarError(ConnectError.from(error));
  }
}

/** The same client, whose calls reject with SidecarError. */
function withSidecarErrors<T extends object>(client: T): T {
  return new Proxy(client, {
    get(target, property, receiver) {
      const value: unknown = Reflect.get(target, property, receiver);
      if (typeof value !== "function") return value;
      return async (...args: unknown[]) => {
        try {
          return await value.apply(target, args);
        } catch (error) {
          throw SidecarError.from(error);
        }
      };
    },
  });
}

/**
 * The generated client of every service on one connection (each call with a
 * deadline, rejecting with SidecarError), plus appendRecords.
 */
export class SidecarClient {
  readonly specs: Client<typeof SpecService>;
  readonly runs: Client<typeof RunService>;
  readonly connections: Client<typeof ConnectionService>;
  readonly turns: Client<typeof TurnService>;
  readonly tools: Client<typeof ToolService>;
  readonly usage: Client<typeof UsageService>;

  constructor(
    transport: Transport,
    private readonly sessionManager: Http2SessionManager,
    private readonly appendAttempts: number,
  ) {
    this.specs = withSidecarErrors(createClient(SpecService, transport));
    this.runs = withSidecarErrors(createClient(RunService, transport));
    this.connections = withSidecarErrors(createClient(ConnectionService, transport));
    this.turns = withSidecarErrors(createClient(TurnService, transport));
    this.tools = withSidecarErrors(createClient(ToolService, transport));
    this.usage = withSidecarErrors(createClient(UsageService, transport));
  }

  /**
   * runs.appendRecords, retried up to appendAttempts in all on Unavailable or
   * DeadlineExceeded with the same request id (a random one when the request
   * has none). The sidecar stores the records once and answers every attempt
   * with the first answer.
   */
  async appendRecords(
    request: MessageInitShape<typeof AppendRecordsRequestSchema>,
    options?: CallOptions,
  ): Promise<AppendRecordsResponse> {
    const withId = { ...request, requestId: request.requestId || randomBytes(16).toString("hex") };
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.runs.appendRecords(withId, options);
      } catch (error) {
        const failure = SidecarError.from(error);
        if (!RETRYABLE_CODES.includes(failure.code) || attempt >= this.appendAttempts) throw failure;
      }
      await sleep(RETRY_BACKOFF_MS * 2 ** (attempt - 1));
    }
  }

  /** Closes the connection. */
  close(): void {
    this.sessionManager.abort();
  }
}

/**
 * Throws at once what is wrong with `address`: a "unix:" socket that is not
 * there (the error's `code` is "ENOENT") or is not a socket, or a socket path
 * written without "unix:". A TCP address is only tried, by connect().
 */
export function checkAddress(address: string): void {
  if (!address) {
    throw new Error("no sidecar address: give the one scripts/serve prints (unix:/…/psych-sidecar-data/sidecar.sock)");
  }
  if (!address.startsWith("unix:")) {
    if (
      !address.includes("://") &&
      (/^[/.~]/.test(address) || address.endsWith(".sock") || (address.includes("/") && !address.includes(":")))
    ) {
      throw new Error(`${address} is a socket path without unix: in front: write unix:${address}`);
    }
    return;
  }
  const path = resolve(address.replace(/^unix:(\/\/)?/, ""));
  const info = statSync(path, { throwIfNoEntry: false });
  if (info === undefined) {
    const directory = dirname(path);
    const why = statSync(directory, { throwIfNoEntry: false })?.isDirectory()
      ? "is the sidecar running, and listening there?"
      : `the directory ${directory} does not exist`;
    throw Object.assign(new Error(`no socket at ${path} (from ${address}): ${why}`), { code: "ENOENT" });
  }
  if (!info.isSocket()) throw new Error(`${path} (from ${address}) is not a socket`);
}

/**
 * Dials `address` — "unix:///absolute.sock", "unix:relative.sock" or
 * "host:port", as the sidecar's --listen takes them — and waits until it
 * reports SERVING, for at most readyTimeoutMs. Before it waits, checkAddress
 * says at once what is wrong with the address.
 */
export async function connect(address: string, options: ConnectOptions = {}): Promise<SidecarClient> {
  checkAddress(address);
  const readyTimeoutMs = options.readyTimeoutMs ?? DEFAULT_READY_TIMEOUT_MS;
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  const socket = address.startsWith("unix:") ? address.replace(/^unix:(\/\/)?/, "") : undefined;
  const baseUrl = socket === undefined ? `http://${address}` : "http://localhost";
  const sessionManager = new Http2SessionManager(
    baseUrl,
    {},
    socket === undefined ? undefined : { createConnection: () => net.connect(socket) },
  );
  const transport = createGrpcTransport({
    baseUrl,
    sessionManager,
    defaultTimeoutMs: options.callTimeoutMs ?? DEFAULT_CALL_TIMEOUT_MS,
    readMaxBytes: maxMessageBytes,
    writeMaxBytes: maxMessageBytes,
    interceptors: options.interceptors,
  });
  const client = new SidecarClient(transport, sessionManager, options.appendAttempts ?? DEFAULT_APPEND_ATTEMPTS);

  const health = createClient(Health, transport);
  const deadline = Date.now() + readyTimeoutMs;
  let last = "no answer";
  while (Date.now() < deadline) {
    try {
      const timeoutMs = Math.max(1, Math.min(1000, deadline - Date.now()));
      const response = await health.check({ service: "" }, { timeoutMs });
      if (response.status === HealthCheckResponse_ServingStatus.SERVING) return client;
      last = HealthCheckResponse_ServingStatus[response.status];
    } catch (error) {
      last = Code[ConnectError.from(error).code];
    }
    await sleep(Math.max(0, Math.min(100, deadline - Date.now())));
  }
  client.close();
  throw new Error(`psych-sidecar at ${address} not SERVING within ${readyTimeoutMs} ms (${last})`);
}
