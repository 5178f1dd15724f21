// A reasoning model's response as the assistant record a host appends, and the
// body to send (docs/prompt.md, "Provider blocks").
//
// Each provider's API needs some of its response back exactly as it sent it:
// Anthropic's thinking and redacted_thinking blocks, OpenAI's reasoning items,
// Gemini's parts carrying a thoughtSignature. These functions take a response
// and keep each such block as a provider block of the assistant record,
// beside the text and tool calls every provider's body shows. Given the
// response body as received (a string or its bytes), a block's JSON is the
// very text it had in the response, never re-encoded; given an object (an
// SDK's parsed response), it is that object's JSON.stringify.

import { type MessageInitShape, create } from "@bufbuild/protobuf";

import {
  type ContentPartSchema,
  Provider,
  type ToolCall,
  ToolCallSchema,
} from "./proto/psych/sidecar/v1/content_pb.js";
import { type Record, RecordSchema } from "./proto/psych/sidecar/v1/run_pb.js";
import type { AssemblePromptResponse } from "./proto/psych/sidecar/v1/turn_service_pb.js";

/** A provider's response: its body as received (text or bytes), or as parsed. */
export type ProviderResponse = string | Uint8Array | object;

/**
 * Anthropic blocks that go back as they came: thinking, server tools' calls and results, and
 * the compaction block of the provider's own compaction.
 */
const ANTHROPIC_KEPT = new Set(["thinking", "redacted_thinking", "server_tool_use", "web_search_tool_result", "compaction"]);

const encoder = new TextEncoder();

/**
 * The body to send to `provider` as AssemblePrompt built it: Anthropic
 * Messages, OpenAI Responses or Gemini generateContent (the Chat Completions
 * body, `openaiRequestJson`, carries no reasoning items). Empty for a body
 * the request did not ask for (its `bodies` field).
 */
export function requestBody(assembled: AssemblePromptResponse, provider: Provider): Uint8Array {
  switch (provider) {
    case Provider.ANTHROPIC:
      return assembled.anthropicRequestJson;
    case Provider.OPENAI:
      return assembled.openaiResponsesRequestJson;
    case Provider.GEMINI:
      return assembled.geminiRequestJson;
    default:
      throw new Error(`no request body for provider ${provider}`);
  }
}

// --- a JSON value with the text it was read from ----------------------------------

/** A JSON value and, when it was read from text, the exact text it spans. */
interface Spanned {
  value: unknown;
  raw: string | undefined;
  items: Spanned[];
  fields: Map<string, Spanned>;
}

function spannedOf(value: unknown): Spanned {
  const node: Spanned = { value, raw: undefined, items: [], fields: new Map() };
  if (Array.isArray(value)) node.items = value.map(spannedOf);
  else if (value !== null && typeof value === "object") {
    for (const [key, field] of Object.entries(value)) node.fields.set(key, spannedOf(field));
  }
  return node;
}

/** Reads JSON text (valid: JSON.parse has checked it) keeping each value's span. */
function spannedText(text: string): Spanned {
  let at = 0;
  const space = /[ \t\n\r]*/y;
  const scalar = /"[^"\\]*(?:\\.[^"\\]*)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null/y;
  const skip = () => {
    space.lastIndex = at;
    space.exec(text);
    at = space.lastIndex;
  };
  const read = (): Spanned => {
    skip();
    const start = at;
    const node: Spanned = { value: undefined, raw: undefined, items: [], fields: new Map() };
    const open = text[at];
    if (open === "[" || open === "{") {
      at++;
      skip();
      const close = open === "[" ? "]" : "}";
      while (text[at] !== close) {
        if (open === "[") node.items.push(read());
        else {
          const key = read().value as string;
          skip();
          at++; // ":"
          node.fields.set(key, read());
        }
        skip();
        if (text[at] === ",") at++;
        skip();
      }
      at++;
      node.value =
        open === "["
          ? node.items.map((item) => item.value)
          : Object.fromEntries([...node.fields].map(([key, field]) => [key, field.value]));
    } else {
      scalar.lastIndex = at;
      const token = scalar.exec(text);
      if (token === null) throw new SyntaxError(`unexpected JSON at ${at}`);
      at = scalar.lastIndex;
      node.value = JSON.parse(token[0]);
    }
    node.raw = text.slice(start, at);
    return node;
  };
  return read();
}

function spanned(response: ProviderResponse): Spanned {
  if (typeof response === "string" || response instanceof Uint8Array) {
    const text = typeof response === "string" ? response : new TextDecoder("utf-8", { fatal: true }).decode(response);
    JSON.parse(text); // throws on anything that is not JSON
    return spannedText(text);
  }
  return spannedOf(response);
}

function field(node: Spanned | undefined, key: string): Spanned | undefined {
  return node?.fields.get(key);
}

function text(node: Spanned | undefined, key: string): string {
  const value = field(node, key)?.value;
  return typeof value === "string" ? value : "";
}

function list(node: Spanned | undefined, what: string): Spanned[] {
  if (node === undefined || !Array.isArray(node.value)) throw new Error(`the response has no ${what} list`);
  return node.items;
}

// --- records ---------------------------------------------------------------------

type Part = MessageInitShape<typeof ContentPartSchema>;

function block(provider: Provider, node: Spanned, type: string, callId = ""): Part {
  const json = encoder.encode(node.raw ?? JSON.stringify(node.value));
  return { kind: { case: "providerBlock", value: { provider, type, json, callId } } };
}

function textPart(value: string): Part {
  return { kind: { case: "text", value } };
}

/** A tool call's JSON arguments as the response spelled them, whitespace removed; "{}" when none. */
function argumentsOf(node: Spanned | undefined): string {
  if (node === undefined) return "{}";
  if (node.raw === undefined) return JSON.stringify(node.value);
  return node.raw.replace(/"[^"\\]*(?:\\.[^"\\]*)*"|[ \t\n\r]+/g, (token) => (token.startsWith('"') ? token : ""));
}

function assistantRecord(content: Part[], calls: ToolCall[]): Record {
  return create(RecordSchema, { kind: { case: "assistantMessage", value: { content, toolCalls: calls } } });
}

/**
 * A Messages API response as the assistant record: thinking,
 * redacted_thinking and server-tool blocks kept in place as Anthropic
 * provider blocks, text blocks as text parts, tool_use blocks as tool calls
 * (their id the call id).
 */
export function anthropicRecord(message: ProviderResponse): Record {
  const content: Part[] = [];
  const calls: ToolCall[] = [];
  for (const node of list(field(spanned(message), "content"), "content")) {
    const type = text(node, "type");
    if (ANTHROPIC_KEPT.has(type)) content.push(block(Provider.ANTHROPIC, node, type));
    else if (type === "text") content.push(textPart(text(node, "text")));
    else if (type === "tool_use") {
      calls.push(
        create(ToolCallSchema, {
          callId: text(node, "id"),
          name: text(node, "name"),
          argumentsJson: argumentsOf(field(node, "input")),
        }),
      );
    }
  }
  return assistantRecord(content, calls);
}

/**
 * A Responses API response as the assistant record: every output item kept
 * in order as an OpenAI provider block (a reasoning item and the items after
 * it go back together, as OpenAI checks), message text also as text parts,
 * function_call items also as tool calls (the item linked to its call by
 * call_id).
 */
export function openaiRecord(response: ProviderResponse): Record {
  const content: Part[] = [];
  const calls: ToolCall[] = [];
  for (const item of list(field(spanned(response), "output"), "output")) {
    const type = text(item, "type");
    let callId = "";
    if (type === "message") {
      for (const part of field(item, "content")?.items ?? []) {
        if (text(part, "type") === "output_text" && text(part, "text")) content.push(textPart(text(part, "text")));
      }
    } else if (type === "function_call") {
      callId = text(item, "call_id");
      calls.push(create(ToolCallSchema, { callId, name: text(item, "name"), argumentsJson: text(item, "arguments") }));
    }
    content.push(block(Provider.OPENAI, item, type, callId));
  }
  return assistantRecord(content, calls);
}

/**
 * A generateContent response's first candidate as the assistant record:
 * thought parts and parts carrying a thoughtSignature kept in place as Gemini
 * provider blocks (a signed functionCall linked to its call, a signed text
 * part as type "text"), text as text parts, function calls as tool calls with
 * the ids the host gives them (`callIds`, one per functionCall, in order:
 * Gemini's calls have none the other providers accept).
 */
export function geminiRecord(response: ProviderResponse, callIds: readonly string[]): Record {
  const candidates = list(field(spanned(response), "candidates"), "candidates");
  if (candidates.length === 0) throw new Error("the response has no candidate");
  const parts = list(field(field(candidates[0], "content"), "parts"), "parts");
  if (parts.filter((part) => field(part, "functionCall") !== undefined).length !== callIds.length) {
    throw new Error("callIds must name every functionCall of the response, in order");
  }
  const content: Part[] = [];
  const calls: ToolCall[] = [];
  let next = 0;
  for (const part of parts) {
    const call = field(part, "functionCall");
    const thought = field(part, "thought")?.value === true;
    let callId = "";
    if (call !== undefined) {
      callId = callIds[next++];
      calls.push(create(ToolCallSchema, { callId, name: text(call, "name"), argumentsJson: argumentsOf(field(call, "args")) }));
    } else if (field(part, "text") !== undefined && !thought) {
      content.push(textPart(text(part, "text")));
    }
    if (text(part, "thoughtSignature") || thought) {
      const type = thought ? "thought" : callId ? "functionCall" : "text";
      content.push(block(Provider.GEMINI, part, type, callId));
    }
  }
  return assistantRecord(content, calls);
}
