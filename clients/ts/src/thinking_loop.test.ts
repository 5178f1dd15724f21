// The README's TypeScript thinking loop, verbatim from "README begin" to
// "README end" (tests/test_readme.py checks they agree); client.test.ts runs it
// against a sidecar with two recorded Messages API responses. No tests here.

import type { Record } from "./proto/psych/sidecar/v1/run_pb.js";
import { Provider, type ToolCall } from "./proto/psych/sidecar/v1/content_pb.js";
import { AnthropicThinking } from "./proto/psych/sidecar/v1/spec_pb.js";
import { DispatchDisposition } from "./proto/psych/sidecar/v1/tool_service_pb.js";

import { type SidecarClient, anthropicRecord, requestBody } from "./index.js";

// README begin
/**
 * Plays one user turn with a thinking model. sendToAnthropic POSTs a body to
 * /v1/messages and resolves to the response body as received (its text);
 * runHostTool runs one of your own tools.
 */
export async function thinkingTurn(
  sidecar: SidecarClient,
  sendToAnthropic: (body: Uint8Array) => Promise<string>,
  runHostTool: (call: ToolCall) => Promise<Record>,
): Promise<void> {
  await sidecar.specs.publishSpec({
    spec: {
      name: "thinking-agent",
      version: 1n,
      instructions: "You help customers.",
      grants: [{ serverPattern: "*", toolPattern: "*" }],
      reasoning: { anthropicThinking: AnthropicThinking.ENABLED, anthropicBudgetTokens: 4000n },
    },
  });
  const { run } = await sidecar.runs.createRun({ tenant: "acme", specName: "thinking-agent", specVersion: 1n });
  const runId = run!.runId;
  const question = { kind: { case: "userMessage" as const, value: { content: [{ kind: { case: "text" as const, value: "Where is my order?" } }] } } };
  await sidecar.appendRecords({ runId, records: [question] });
  for (;;) {
    const assembled = await sidecar.turns.assemblePrompt({ runId, model: "claude-sonnet-4-5", maxTokens: 16000 });
    // The body as it is: thinking blocks of earlier steps back in place, byte for byte.
    const message = await sendToAnthropic(requestBody(assembled, Provider.ANTHROPIC));
    const reply = anthropicRecord(message); // thinking kept as the response's own text
    await sidecar.appendRecords({ runId, records: [reply] });
    const calls = reply.kind.case === "assistantMessage" ? reply.kind.value.toolCalls : [];
    if (calls.length === 0) return;
    const results: Record[] = [];
    for (const call of calls) {
      const outcome = await sidecar.tools.dispatchToolCall({ runId, call }, { timeoutMs: 60_000 });
      // The sidecar ran its own tools and recorded their results; yours are yours to run.
      if (outcome.disposition === DispatchDisposition.HOST_TOOL) results.push(await runHostTool(call));
    }
    if (results.length > 0) await sidecar.appendRecords({ runId, records: results });
  }
}
// README end
