package sidecarclient_test

// The provider-block helpers: a recorded response of each provider, in its
// documented shape and written with the whitespace, key order and escapes a
// provider may use, becomes the assistant record; the blocks go to the sidecar
// and come back in that provider's body as the very bytes of the response.

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	sidecarclient "github.com/psych-sidecar/psych-sidecar/clients/go"
	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
)

const (
	anthropicThinking = `{"signature": "EqQBCgIYAhIM\u002b", "type":"thinking","thinking":"Look it up."}`
	anthropicRedacted = `{"type":"redacted_thinking","data":"EmwKAhgBEgy3"}`
	anthropicResponse = `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",
  "content": [` + anthropicThinking + `,
    ` + anthropicRedacted + `,
    {"type":"text","text":"Checking."},
    {"type":"tool_use","id":"toolu_1","name":"weather","input":{ "city": "K\u00f6ln" }}],
  "stop_reason":"tool_use","usage":{"input_tokens":10,"output_tokens":5}}`

	openAIReasoning = `{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAAB=="}`
	openAICall      = `{"type":"function_call","id":"fc_1","call_id":"call_1","name":"weather","arguments":"{\"city\":\"Paris\"}","status":"completed"}`
	openAIResponse  = `{"id":"resp_1","object":"response","output":[
  ` + openAIReasoning + `,
  ` + openAICall + `]}`

	geminiSigned  = `{"functionCall":{"name":"weather","args":{"city":"Rome"}},"thoughtSignature":"Q2lRQjB4"}`
	geminiThought = `{"text":"Thinking about Rome.","thought":true}`
	geminiParts   = `{"candidates":[{"content":{"role":"model","parts":[` + geminiThought + `,{"text":"Let me look."},` +
		geminiSigned + `,{"functionCall":{"name":"weather","args":{"city":"Milan"}}}]}}]}`
)

func blocksOf(t *testing.T, record *sidecarv1.Record) []*sidecarv1.ProviderBlock {
	t.Helper()
	var blocks []*sidecarv1.ProviderBlock
	for _, part := range record.GetAssistantMessage().GetContent() {
		if block := part.GetProviderBlock(); block != nil {
			blocks = append(blocks, block)
		}
	}
	return blocks
}

func TestAnAnthropicResponseKeepsItsThinkingBlocksAsReceived(t *testing.T) {
	record, err := sidecarclient.AnthropicRecord([]byte(anthropicResponse))
	if err != nil {
		t.Fatal(err)
	}
	blocks := blocksOf(t, record)
	if len(blocks) != 2 || string(blocks[0].GetJson()) != anthropicThinking || string(blocks[1].GetJson()) != anthropicRedacted {
		t.Fatalf("blocks %v, want the response's thinking and redacted_thinking bytes", blocks)
	}
	if blocks[0].GetType() != "thinking" || blocks[1].GetType() != "redacted_thinking" ||
		blocks[0].GetProvider() != sidecarv1.Provider_PROVIDER_ANTHROPIC {
		t.Fatalf("envelopes %v", blocks)
	}
	message := record.GetAssistantMessage()
	if got := message.GetContent()[2].GetText(); got != "Checking." {
		t.Fatalf("text part %q", got)
	}
	call := message.GetToolCalls()[0]
	if call.GetCallId() != "toolu_1" || call.GetName() != "weather" || call.GetArgumentsJson() != `{"city":"K\u00f6ln"}` {
		t.Fatalf("tool call %v", call)
	}
}

func TestAnAnthropicCompactionBlockIsKeptAsReceived(t *testing.T) {
	compaction := `{"type": "compaction", "content": "Summary.", "encrypted_content":"Eo0B"}`
	response := `{"id":"msg_2","type":"message","role":"assistant","content":[` + compaction +
		`,{"type":"text","text":"Go on."}],"stop_reason":"end_turn"}`
	record, err := sidecarclient.AnthropicRecord([]byte(response))
	if err != nil {
		t.Fatal(err)
	}
	blocks := blocksOf(t, record)
	if len(blocks) != 1 || string(blocks[0].GetJson()) != compaction || blocks[0].GetType() != "compaction" {
		t.Fatalf("blocks %v, want the response's compaction block bytes", blocks)
	}
	if first := record.GetAssistantMessage().GetContent()[0]; first.GetProviderBlock() == nil {
		t.Fatalf("content %v, want the compaction block first", record.GetAssistantMessage().GetContent())
	}
}

func TestAnOpenAIResponseKeepsEveryOutputItemInOrder(t *testing.T) {
	record, err := sidecarclient.OpenAIRecord([]byte(openAIResponse))
	if err != nil {
		t.Fatal(err)
	}
	blocks := blocksOf(t, record)
	if len(blocks) != 2 || string(blocks[0].GetJson()) != openAIReasoning || string(blocks[1].GetJson()) != openAICall {
		t.Fatalf("blocks %v, want the reasoning and function_call items' bytes", blocks)
	}
	if blocks[0].GetType() != "reasoning" || blocks[1].GetCallId() != "call_1" {
		t.Fatalf("envelopes %v", blocks)
	}
	call := record.GetAssistantMessage().GetToolCalls()[0]
	if call.GetCallId() != "call_1" || call.GetArgumentsJson() != `{"city":"Paris"}` {
		t.Fatalf("tool call %v", call)
	}
}

func TestAGeminiResponseKeepsItsSignedAndThoughtParts(t *testing.T) {
	if _, err := sidecarclient.GeminiRecord([]byte(geminiParts), []string{"g1"}); err == nil {
		t.Fatal("one id for two functionCall parts was taken")
	}
	record, err := sidecarclient.GeminiRecord([]byte(geminiParts), []string{"g1", "g2"})
	if err != nil {
		t.Fatal(err)
	}
	blocks := blocksOf(t, record)
	if len(blocks) != 2 || string(blocks[0].GetJson()) != geminiThought || string(blocks[1].GetJson()) != geminiSigned {
		t.Fatalf("blocks %v, want the thought part and the signed functionCall part", blocks)
	}
	if blocks[0].GetType() != "thought" || blocks[1].GetType() != "functionCall" || blocks[1].GetCallId() != "g1" {
		t.Fatalf("envelopes %v", blocks)
	}
	message := record.GetAssistantMessage()
	if len(message.GetToolCalls()) != 2 || message.GetToolCalls()[1].GetCallId() != "g2" ||
		message.GetToolCalls()[1].GetArgumentsJson() != `{"city":"Milan"}` {
		t.Fatalf("tool calls %v", message.GetToolCalls())
	}
	if message.GetContent()[1].GetText() != "Let me look." {
		t.Fatalf("content %v", message.GetContent())
	}
}

func TestAResponseThatIsNotJSONIsRefused(t *testing.T) {
	for name, convert := range map[string]func() error{
		"anthropic": func() error { _, err := sidecarclient.AnthropicRecord([]byte("<html>")); return err },
		"openai":    func() error { _, err := sidecarclient.OpenAIRecord([]byte(`{"output":"x"}`)); return err },
		"gemini":    func() error { _, err := sidecarclient.GeminiRecord([]byte(`{"candidates":[]}`), nil); return err },
	} {
		if convert() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// assembleAfter appends a user message, the record and the results of its
// calls, then assembles the prompt.
func assembleAfter(t *testing.T, client *sidecarclient.Client, record *sidecarv1.Record) *sidecarv1.AssemblePromptResponse {
	t.Helper()
	ctx := context.Background()
	runID := newRun(t, client)
	records := []*sidecarv1.Record{user("Weather?"), record}
	for _, call := range record.GetAssistantMessage().GetToolCalls() {
		records = append(records, toolResult(call.GetCallId(), "18 C"))
	}
	if _, err := client.AppendRecords(ctx, &sidecarv1.AppendRecordsRequest{RunId: runID, Records: records}); err != nil {
		t.Fatal(err)
	}
	assembled, err := client.Turns.AssemblePrompt(ctx, &sidecarv1.AssemblePromptRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	return assembled
}

func TestEachProvidersBlocksGoBackInItsOwnBodyByteForByte(t *testing.T) {
	client := dial(t, shared.unix, sidecarclient.Options{})
	anthropic, err := sidecarclient.AnthropicRecord([]byte(anthropicResponse))
	if err != nil {
		t.Fatal(err)
	}
	openAI, err := sidecarclient.OpenAIRecord([]byte(openAIResponse))
	if err != nil {
		t.Fatal(err)
	}
	gemini, err := sidecarclient.GeminiRecord([]byte(geminiParts), []string{"g1", "g2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		record   *sidecarv1.Record
		provider sidecarv1.Provider
		blocks   []string
	}{
		{"anthropic", anthropic, sidecarv1.Provider_PROVIDER_ANTHROPIC, []string{anthropicThinking, anthropicRedacted}},
		{"openai", openAI, sidecarv1.Provider_PROVIDER_OPENAI, []string{openAIReasoning, openAICall}},
		{"gemini", gemini, sidecarv1.Provider_PROVIDER_GEMINI, []string{geminiThought, geminiSigned}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assembled := assembleAfter(t, client, c.record)
			body := sidecarclient.RequestBody(assembled, c.provider)
			if !json.Valid(body) {
				t.Fatalf("body is not JSON: %s", body)
			}
			// Each as the response had it, in the response's order.
			at := 0
			for _, block := range c.blocks {
				found := bytes.Index(body[at:], []byte(block))
				if found < 0 {
					t.Fatalf("the %s body lacks %s after byte %d:\n%s", c.name, block, at, body)
				}
				at += found + len(block)
			}
			// Never in another provider's body, nor in Chat Completions'.
			for _, other := range []sidecarv1.Provider{
				sidecarv1.Provider_PROVIDER_ANTHROPIC, sidecarv1.Provider_PROVIDER_OPENAI, sidecarv1.Provider_PROVIDER_GEMINI,
			} {
				if other != c.provider && bytes.Contains(sidecarclient.RequestBody(assembled, other), []byte(c.blocks[0])) {
					t.Fatalf("the %v body carries a %s block", other, c.name)
				}
			}
			if bytes.Contains(assembled.GetOpenaiRequestJson(), []byte(c.blocks[0])) {
				t.Fatalf("the Chat Completions body carries a %s block", c.name)
			}
		})
	}
	if sidecarclient.RequestBody(&sidecarv1.AssemblePromptResponse{}, sidecarv1.Provider_PROVIDER_UNSPECIFIED) != nil {
		t.Fatal("a body for no provider")
	}
}
