// The provider-block helpers on recorded responses of each provider
// (recorded_responses.test.ts): the blocks keep the response's own text, byte
// for byte. client.test.ts sends them through a sidecar and finds them in the
// bodies.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Provider } from "./proto/psych/sidecar/v1/content_pb.js";
import type { Record } from "./proto/psych/sidecar/v1/run_pb.js";

import { anthropicRecord, geminiRecord, openaiRecord } from "./index.js";
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

const decoder = new TextDecoder();

function assistant(record: Record) {
  if (record.kind.case !== "assistantMessage") assert.fail(`not an assistant record: ${record.kind.case}`);
  return record.kind.value;
}

function blocks(record: Record) {
  return assistant(record).content.flatMap((part) => (part.kind.case === "providerBlock" ? [part.kind.value] : []));
}

test("an Anthropic response keeps its thinking blocks as received", () => {
  for (const response of [ANTHROPIC_RESPONSE, new TextEncoder().encode(ANTHROPIC_RESPONSE)]) {
    const record = anthropicRecord(response);
    const kept = blocks(record);
    assert.deepEqual(
      kept.map((b) => [b.provider, b.type, decoder.decode(b.json)]),
      [
        [Provider.ANTHROPIC, "thinking", ANTHROPIC_THINKING],
        [Provider.ANTHROPIC, "redacted_thinking", ANTHROPIC_REDACTED],
      ],
    );
    const message = assistant(record);
    assert.deepEqual(message.content[2].kind, { case: "text", value: "Checking." });
    assert.deepEqual(
      message.toolCalls.map((c) => [c.callId, c.name, c.argumentsJson]),
      [["toolu_1", "weather", '{"city":"K\\u00f6ln"}']],
    );
  }
});

test("a parsed Anthropic response keeps the JSON of its blocks", () => {
  const kept = blocks(anthropicRecord(JSON.parse(ANTHROPIC_RESPONSE) as object));
  assert.deepEqual(JSON.parse(decoder.decode(kept[0].json)), JSON.parse(ANTHROPIC_THINKING));
});

test("an OpenAI response keeps every output item in order", () => {
  const record = openaiRecord(OPENAI_RESPONSE);
  assert.deepEqual(
    blocks(record).map((b) => [b.type, b.callId, decoder.decode(b.json)]),
    [
      ["reasoning", "", OPENAI_REASONING],
      ["function_call", "call_1", OPENAI_CALL],
    ],
  );
  assert.deepEqual(
    assistant(record).toolCalls.map((c) => [c.callId, c.argumentsJson]),
    [["call_1", '{"city":"Paris"}']],
  );
  const message = openaiRecord({
    output: [{ type: "message", role: "assistant", content: [{ type: "output_text", text: "Done." }] }],
  });
  assert.deepEqual(assistant(message).content[0].kind, { case: "text", value: "Done." });
  assert.equal(blocks(message)[0].type, "message");
});

test("a Gemini response keeps its signed and thought parts", () => {
  assert.throws(() => geminiRecord(GEMINI_RESPONSE, ["g1"]), /callIds must name every functionCall/);
  const record = geminiRecord(GEMINI_RESPONSE, ["g1", "g2"]);
  assert.deepEqual(
    blocks(record).map((b) => [b.type, b.callId, decoder.decode(b.json)]),
    [
      ["thought", "", GEMINI_THOUGHT],
      ["functionCall", "g1", GEMINI_SIGNED],
    ],
  );
  assert.deepEqual(
    assistant(record).toolCalls.map((c) => [c.callId, c.name, c.argumentsJson]),
    [
      ["g1", "weather", '{"city":"Rome"}'],
      ["g2", "weather", '{"city":"Milan"}'],
    ],
  );
  assert.deepEqual(assistant(record).content[1].kind, { case: "text", value: "Let me look." });
});

test("a response that is not one is refused", () => {
  assert.throws(() => anthropicRecord("<html>"), SyntaxError);
  assert.throws(() => openaiRecord('{"output":"x"}'), /no output list/);
  assert.throws(() => geminiRecord('{"candidates":[]}', []), /no candidate/);
});

test("a long thinking block is kept whole", () => {
  const piece = 'a\\n\\"b\\" '; // JSON escapes, as the text has them
  const thinking = `{"type":"thinking","thinking":"${piece.repeat(300_000)}","signature":"Eq"}`;
  const kept = blocks(anthropicRecord(`{"content":[${thinking}]}`));
  assert.equal(decoder.decode(kept[0].json), thinking);
});
