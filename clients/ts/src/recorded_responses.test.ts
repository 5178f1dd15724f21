// Recorded responses of each provider, in its documented shape and written with the
// whitespace, key order and escapes a provider may use (test data only: no tests here, and,
// as every *.test.* file, not in the package). provider_blocks.test.ts and client.test.ts
// read them.

export const ANTHROPIC_THINKING = '{"signature": "EqQBCgIYAhIM\\u002b", "type":"thinking","thinking":"Look it up."}';
export const ANTHROPIC_REDACTED = '{"type":"redacted_thinking","data":"EmwKAhgBEgy3"}';
export const ANTHROPIC_RESPONSE = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",
  "content": [${ANTHROPIC_THINKING},
    ${ANTHROPIC_REDACTED},
    {"type":"text","text":"Checking."},
    {"type":"tool_use","id":"toolu_1","name":"weather","input":{ "city": "K\\u00f6ln" }}],
  "stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5}}`;

export const OPENAI_REASONING = '{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAAB=="}';
export const OPENAI_CALL =
  '{"type":"function_call","id":"fc_1","call_id":"call_1","name":"weather","arguments":"{\\"city\\":\\"Paris\\"}","status":"completed"}';
export const OPENAI_RESPONSE = `{"id":"resp_1","object":"response","output":[
  ${OPENAI_REASONING},
  ${OPENAI_CALL}]}`;

export const GEMINI_SIGNED = '{"functionCall":{"name":"weather","args":{"city":"Rome"}},"thoughtSignature":"Q2lRQjB4"}';
export const GEMINI_THOUGHT = '{"text":"Thinking about Rome.","thought":true}';
export const GEMINI_RESPONSE = `{"candidates":[{"content":{"role":"model","parts":[${GEMINI_THOUGHT},{"text":"Let me look."},${GEMINI_SIGNED},{"functionCall":{"name":"weather","args":{"city":"Milan"}}}]}}]}`;
