// The README's TypeScript snippet, verbatim from "README begin" to "README end"
// (tests/test_readme.py checks they agree); readme.test.ts runs it against a
// sidecar on scripts/serve's defaults, and scripts/test-examples from a scratch
// project outside the clone, made as the README says.

// README begin
import { statSync } from "node:fs";
import net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { ErrorInfoSchema } from "@psych-sidecar/client/proto/google/rpc/error_details_pb";
import { Health, HealthCheckResponse_ServingStatus } from "@psych-sidecar/client/proto/grpc/health/v1/health_pb";
import { RunService } from "@psych-sidecar/client/proto/psych/sidecar/v1/run_service_pb";
import { SpecService } from "@psych-sidecar/client/proto/psych/sidecar/v1/spec_service_pb";

// The address scripts/serve printed ("serve: SERVING on unix:/…/sidecar.sock").
const address = process.env.PSYCH_SIDECAR_ADDRESS;
if (!address?.startsWith("unix:")) {
  throw new Error("set PSYCH_SIDECAR_ADDRESS to the address scripts/serve printed (unix:/…/sidecar.sock)");
}
const socket = address.replace(/^unix:(\/\/)?/, "");
// No socket there: say so now, not after 20 s of retries.
if (!statSync(socket, { throwIfNoEntry: false })?.isSocket()) {
  throw new Error(`no socket at ${socket} (PSYCH_SIDECAR_ADDRESS=${address}): is scripts/serve running?`);
}

// gRPC over HTTP/2 on the Unix socket: the URL only names the authority.
const transport = createGrpcTransport({
  baseUrl: "http://localhost",
  nodeOptions: { createConnection: () => net.connect(socket) },
  readMaxBytes: 64 << 20,
  writeMaxBytes: 64 << 20,
  defaultTimeoutMs: 10_000,
});

// Ready when health says SERVING.
const health = createClient(Health, transport);
for (const deadline = Date.now() + 20_000; ; await sleep(100)) {
  const status = await health.check({}).then((r) => r.status, () => undefined);
  if (status === HealthCheckResponse_ServingStatus.SERVING) break;
  if (Date.now() > deadline) throw new Error(`sidecar at ${address} not SERVING`);
}
const specs = createClient(SpecService, transport);
const runs = createClient(RunService, transport);

// Once per agent version. Versions are immutable; bad thresholds are refused here.
await specs.publishSpec({
  spec: {
    name: "support-agent", version: 1n, instructions: "You help customers.",
    thresholds: { perResultTokens: 4000n, perBatchTokens: 16000n },
    grants: [{ serverPattern: "*", toolPattern: "*" }],
  },
});
const { run } = await runs.createRun({ tenant: "acme", specName: "support-agent", specVersion: 1n });

// A request id makes a retried append (after a lost response) store once.
const appended = await runs.appendRecords({
  runId: run!.runId, requestId: "turn-1-user",
  records: [{ kind: { case: "userMessage", value: { content: [{ kind: { case: "text", value: "Where is my order?" } }] } } }],
});
console.log("appended at sequence", appended.records[0].sequence); // 1n

// Every error carries one google.rpc.ErrorInfo: switch on its reason (docs/errors.md).
try {
  await runs.getRun({ runId: "run_missing" });
} catch (error) {
  const failure = ConnectError.from(error);
  const [info] = failure.findDetails(ErrorInfoSchema);
  if (info?.reason === "RUN_NOT_FOUND") {
    console.log(Code[failure.code], info.reason, info.metadata.run_id); // NotFound RUN_NOT_FOUND run_missing
  }
}
// README end
