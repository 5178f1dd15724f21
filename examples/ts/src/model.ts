// The scripted model: what an LLM would decide, written as fixed rules keyed on
// what the prompt shows. It reads nothing but the assembled prompt, as a model
// would, and it reports usage the way a provider does.

import type { ContentPart } from "@psych-sidecar/client/proto/psych/sidecar/v1/content_pb";
import {
  DisclosureTier,
  type Prompt,
  type PromptMessage,
  type PromptToolResult,
} from "@psych-sidecar/client/proto/psych/sidecar/v1/turn_pb";
import type { AssemblePromptResponse } from "@psych-sidecar/client/proto/psych/sidecar/v1/turn_service_pb";

/** How many characters the model asks the fixture's huge_text for. */
const REPORT_SIZE = 20000;
/** How many characters the model reads back. */
const READ_BACK_LIMIT = 60;
/** The handle and the offset after the head, in an elided view's guidance. */
const GUIDANCE = /read_tool_output\(handle="([^"]+)"\): offset (\d+) continues after the head/;
/** The note read_tool_output ends a partial read with. */
const CONTINUATION = /\n\[Characters \d+ to \d+ of \d+: continue with offset \d+\.\]$/;

export interface Decision {
  /** The answer's text, when the model answers. */
  text: string;
  /** The tool calls, when it calls tools; the host assigns their ids. */
  calls: { name: string; argumentsJson: string }[];
  /** Usage as the provider reports it. */
  inputTokens: bigint;
  outputTokens: bigint;
}

/** One model call. */
export function decide(assembled: AssemblePromptResponse): Decision {
  const prompt = assembled.prompt;
  const last = prompt?.history.at(-1);
  if (prompt === undefined || last === undefined) throw new Error("the prompt has no history");
  const decision = next(prompt, last);
  // A stand-in for the provider's token counts: about four bytes a token.
  decision.inputTokens = assembled.zones.reduce((sum, zone) => sum + zone.byteLength / 4n, 0n);
  decision.outputTokens = BigInt(Math.floor(decision.text.length / 4) + 20 * decision.calls.length);
  return decision;
}

function next(prompt: Prompt, last: PromptMessage): Decision {
  const results = toolResults(last);
  if (results.length > 0) return afterToolResult(prompt, results[results.length - 1]);
  const said = contentText(last.parts.flatMap((part) => (part.kind.case === "content" ? [part.kind.value] : [])));
  if (said.includes("report") && said.includes("Fetch")) {
    // The user means the fixture server, which is deferred: the prompt shows
    // only its line, so the model first lists what it may call there.
    const line = prompt.tools?.servers.find(
      (server) => server.tier === DisclosureTier.DEFERRED && said.includes(`${server.server} server`),
    );
    if (line === undefined) throw new Error("the prompt shows no deferred server the user named");
    return call("mcp_list_tools", { server: line.server });
  }
  if (said.includes("after the part")) {
    // The result of the earlier turn is elided now: the guidance in its view
    // says which handle to read and where the head ends.
    const elided = prompt.history.flatMap(toolResults).find((result) => result.elided);
    if (elided === undefined) throw new Error("the prompt shows no elided result");
    const found = GUIDANCE.exec(contentText(elided.content));
    if (found === null) throw new Error(`the elided view of ${elided.callId} has no read_tool_output guidance`);
    return call("read_tool_output", { handle: found[1], offset: Number(found[2]), limit: READ_BACK_LIMIT });
  }
  return answer("Glad to help.");
}

function afterToolResult(prompt: Prompt, result: PromptToolResult): Decision {
  const text = contentText(result.content);
  if (result.isError) throw new Error(`a tool failed: ${text}`);
  switch (calledTool(prompt, result.callId)) {
    case "mcp_list_tools": {
      const listed = JSON.parse(text) as { server: string; tools: string[] };
      if (!listed.tools.includes("huge_text")) throw new Error(`${listed.server} has no huge_text tool: ${listed.tools}`);
      return call("mcp_call_tool", { server: listed.server, tool: "huge_text", input: { size: REPORT_SIZE } });
    }
    case "mcp_call_tool":
      return answer(`The report is ${[...text].length} characters long.`);
    case "read_tool_output":
      return answer(`Right after the preview it goes on with ${JSON.stringify(text.replace(CONTINUATION, ""))}.`);
  }
  throw new Error(`the script has no move after ${result.callId}`);
}

/**
 * The scripted model's thinking, as a thinking model's response carries it: its
 * signature is what Anthropic checks when the block comes back, so the host must
 * send it back as it came.
 */
export const THINKING_BLOCK =
  '{"type":"thinking","thinking":"The script says what comes next.","signature":"c2NyaXB0ZWQtbW9kZWw="}';

/**
 * The decision as a Messages API response with thinking: the thinking block,
 * then the text, then a tool_use block per call with the ids given.
 */
export function messagesResponse(decision: Decision, ids: string[]): string {
  const blocks = [THINKING_BLOCK];
  if (decision.text) blocks.push(JSON.stringify({ type: "text", text: decision.text }));
  decision.calls.forEach((call, index) => {
    blocks.push(
      `{"type":"tool_use","id":${JSON.stringify(ids[index])},"name":${JSON.stringify(call.name)},"input":${call.argumentsJson}}`,
    );
  });
  const stop = decision.calls.length > 0 ? "tool_use" : "end_turn";
  return `{"id":"msg_scripted","type":"message","role":"assistant","content":[${blocks.join(",")}],"stop_reason":"${stop}"}`;
}

function answer(text: string): Decision {
  return { text, calls: [], inputTokens: 0n, outputTokens: 0n };
}

function call(name: string, args: object): Decision {
  return { text: "", calls: [{ name, argumentsJson: JSON.stringify(args) }], inputTokens: 0n, outputTokens: 0n };
}

/** The name of the tool the history's call with that id called. */
function calledTool(prompt: Prompt, callId: string): string | undefined {
  for (const message of prompt.history) {
    for (const part of message.parts) {
      if (part.kind.case === "toolCall" && part.kind.value.callId === callId) return part.kind.value.name;
    }
  }
  return undefined;
}

function toolResults(message: PromptMessage): PromptToolResult[] {
  return message.parts.flatMap((part) => (part.kind.case === "toolResult" ? [part.kind.value] : []));
}

/** What a model reads of some content: text and JSON parts. */
export function contentText(parts: ContentPart[]): string {
  const decoder = new TextDecoder();
  return parts
    .map((part) =>
      part.kind.case === "text" ? part.kind.value : part.kind.case === "json" ? decoder.decode(part.kind.value) : "",
    )
    .join("");
}
