package sidecarclient_test

// The README's Go thinking loop, verbatim from "README begin" to "README end"
// (tests/test_readme.py checks they agree); TestTheReadmesThinkingLoop runs it
// against the sidecar with two recorded Messages API responses.

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	sidecarclient "github.com/psych-sidecar/psych-sidecar/clients/go"
	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
	"google.golang.org/protobuf/proto"
)

// README begin
// thinkingTurn plays one user turn with a thinking model. sendToAnthropic POSTs
// a body to /v1/messages and returns the response body as received;
// runHostTool runs one of your own tools.
func thinkingTurn(ctx context.Context, sidecar *sidecarclient.Client,
	sendToAnthropic func(body []byte) ([]byte, error),
	runHostTool func(call *sidecarv1.ToolCall) *sidecarv1.Record) error {
	thinking := &sidecarv1.ReasoningSettings{
		AnthropicThinking:     sidecarv1.AnthropicThinking_ANTHROPIC_THINKING_ENABLED,
		AnthropicBudgetTokens: proto.Int64(4000),
	}
	if _, err := sidecar.Specs.PublishSpec(ctx, &sidecarv1.PublishSpecRequest{Spec: &sidecarv1.Spec{
		Name: "thinking-agent", Version: 1, Instructions: "You help customers.",
		Grants:    []*sidecarv1.ToolGrant{{ServerPattern: "*", ToolPattern: "*"}},
		Reasoning: thinking,
	}}); err != nil {
		return err
	}
	created, err := sidecar.Runs.CreateRun(ctx, &sidecarv1.CreateRunRequest{
		Tenant: "acme", SpecName: "thinking-agent", SpecVersion: 1,
	})
	if err != nil {
		return err
	}
	runID := created.GetRun().GetRunId()
	records := []*sidecarv1.Record{{Kind: &sidecarv1.Record_UserMessage{UserMessage: &sidecarv1.UserMessage{
		Content: []*sidecarv1.ContentPart{{Kind: &sidecarv1.ContentPart_Text{Text: "Where is my order?"}}},
	}}}}
	for {
		if len(records) > 0 {
			if _, err := sidecar.AppendRecords(ctx, &sidecarv1.AppendRecordsRequest{RunId: runID, Records: records}); err != nil {
				return err
			}
		}
		assembled, err := sidecar.Turns.AssemblePrompt(ctx, &sidecarv1.AssemblePromptRequest{
			RunId: runID, Model: "claude-sonnet-4-5", MaxTokens: 16000,
		})
		if err != nil {
			return err
		}
		// The body as it is: thinking blocks of earlier steps back in place, byte for byte.
		message, err := sendToAnthropic(sidecarclient.RequestBody(assembled, sidecarv1.Provider_PROVIDER_ANTHROPIC))
		if err != nil {
			return err
		}
		reply, err := sidecarclient.AnthropicRecord(message) // thinking kept as the response's own bytes
		if err != nil {
			return err
		}
		if _, err := sidecar.AppendRecords(ctx, &sidecarv1.AppendRecordsRequest{
			RunId: runID, Records: []*sidecarv1.Record{reply},
		}); err != nil {
			return err
		}
		calls := reply.GetAssistantMessage().GetToolCalls()
		if len(calls) == 0 {
			return nil
		}
		records = nil
		for _, call := range calls {
			outcome, err := sidecar.Tools.DispatchToolCall(ctx, &sidecarv1.DispatchToolCallRequest{RunId: runID, Call: call})
			if err != nil {
				return err
			}
			// The sidecar ran its own tools and recorded their results; yours are yours to run.
			if outcome.GetDisposition() == sidecarv1.DispatchDisposition_DISPATCH_DISPOSITION_HOST_TOOL {
				records = append(records, runHostTool(call))
			}
		}
	}
}

// README end

func TestTheReadmesThinkingLoop(t *testing.T) {
	client := dial(t, shared.unix, sidecarclient.Options{})
	thinking := `{"type":"thinking","thinking":"Look the order up.","signature":"EqQBCgIY"}`
	responses := []string{
		`{"content":[` + thinking + `,{"type":"tool_use","id":"toolu_1","name":"find_order","input":{"n":7}}]}`,
		`{"content":[{"type":"thinking","thinking":"Done.","signature":"Ev4B"},{"type":"text","text":"It ships tomorrow."}]}`,
	}
	var sent [][]byte
	send := func(body []byte) ([]byte, error) {
		sent = append(sent, body)
		return []byte(responses[len(sent)-1]), nil
	}
	runHostTool := func(call *sidecarv1.ToolCall) *sidecarv1.Record {
		return toolResult(call.GetCallId(), "shipped")
	}
	if err := thinkingTurn(context.Background(), client, send, runHostTool); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 2 {
		t.Fatalf("%d requests, want 2", len(sent))
	}
	var first struct {
		Thinking map[string]any `json:"thinking"`
	}
	if err := json.Unmarshal(sent[0], &first); err != nil {
		t.Fatal(err)
	}
	if first.Thinking["type"] != "enabled" || first.Thinking["budget_tokens"] != 4000.0 {
		t.Fatalf("thinking parameter %v", first.Thinking)
	}
	// The second request carries the first response's thinking block as it came.
	if !bytes.Contains(sent[1], []byte(`{"role":"assistant","content":[`+thinking+`,{"type":"tool_use"`)) {
		t.Fatalf("the second request lacks the thinking block in place:\n%s", sent[1])
	}
}
