package sidecarclient

// A reasoning model's response as the assistant record a host appends, and
// the body to send (docs/prompt.md, "Provider blocks").
//
// Each provider's API needs some of its response back exactly as it sent it:
// Anthropic's thinking and redacted_thinking blocks, OpenAI's reasoning items,
// Gemini's parts carrying a thoughtSignature. These functions take the
// response body as received from the provider and keep each such block as a
// provider block of the assistant record, its JSON the very bytes it had in
// the response (a sub-slice, never re-encoded), beside the text and tool
// calls every provider's body shows.

import (
	"bytes"
	"encoding/json"
	"fmt"

	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
)

// Anthropic blocks that go back as they came: thinking, server tools' calls
// and results, and the compaction block of the provider's own compaction.
var anthropicKept = map[string]bool{
	"thinking": true, "redacted_thinking": true, "server_tool_use": true, "web_search_tool_result": true,
	"compaction": true,
}

// RequestBody is the body to send to provider as AssemblePrompt built it:
// Anthropic Messages, OpenAI Responses or Gemini generateContent (the Chat
// Completions body, OpenaiRequestJson, carries no reasoning items). Nil for
// any other provider, and for a body the request did not ask for (its
// bodies field).
func RequestBody(assembled *sidecarv1.AssemblePromptResponse, provider sidecarv1.Provider) []byte {
	switch provider {
	case sidecarv1.Provider_PROVIDER_ANTHROPIC:
		return assembled.GetAnthropicRequestJson()
	case sidecarv1.Provider_PROVIDER_OPENAI:
		return assembled.GetOpenaiResponsesRequestJson()
	case sidecarv1.Provider_PROVIDER_GEMINI:
		return assembled.GetGeminiRequestJson()
	}
	return nil
}

func providerBlock(provider sidecarv1.Provider, raw json.RawMessage, blockType, callID string) *sidecarv1.ContentPart {
	return &sidecarv1.ContentPart{Kind: &sidecarv1.ContentPart_ProviderBlock{ProviderBlock: &sidecarv1.ProviderBlock{
		Provider: provider, Type: blockType, Json: raw, CallId: callID,
	}}}
}

func textPart(text string) *sidecarv1.ContentPart {
	return &sidecarv1.ContentPart{Kind: &sidecarv1.ContentPart_Text{Text: text}}
}

func assistantRecord(content []*sidecarv1.ContentPart, calls []*sidecarv1.ToolCall) *sidecarv1.Record {
	return &sidecarv1.Record{Kind: &sidecarv1.Record_AssistantMessage{AssistantMessage: &sidecarv1.AssistantMessage{
		Content: content, ToolCalls: calls,
	}}}
}

// arguments is a tool call's JSON arguments, whitespace removed; "{}" when
// there are none.
func arguments(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "{}", nil
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return "", err
	}
	return compact.String(), nil
}

// AnthropicRecord is the assistant record of a Messages API response body:
// thinking, redacted_thinking and server-tool blocks kept in place as
// Anthropic provider blocks, text blocks as text parts, tool_use blocks as
// tool calls (their id the call id).
func AnthropicRecord(message []byte) (*sidecarv1.Record, error) {
	var response struct {
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(message, &response); err != nil {
		return nil, fmt.Errorf("not a Messages API response: %w", err)
	}
	var content []*sidecarv1.ContentPart
	var calls []*sidecarv1.ToolCall
	for _, raw := range response.Content {
		var block struct {
			Type  string          `json:"type"`
			Text  string          `json:"text"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		}
		if err := json.Unmarshal(raw, &block); err != nil {
			return nil, fmt.Errorf("a content block of the response: %w", err)
		}
		switch {
		case anthropicKept[block.Type]:
			content = append(content, providerBlock(sidecarv1.Provider_PROVIDER_ANTHROPIC, raw, block.Type, ""))
		case block.Type == "text":
			content = append(content, textPart(block.Text))
		case block.Type == "tool_use":
			input, err := arguments(block.Input)
			if err != nil {
				return nil, fmt.Errorf("tool_use %s: %w", block.ID, err)
			}
			calls = append(calls, &sidecarv1.ToolCall{CallId: block.ID, Name: block.Name, ArgumentsJson: input})
		}
	}
	return assistantRecord(content, calls), nil
}

// OpenAIRecord is the assistant record of a Responses API response body:
// every output item kept in order as an OpenAI provider block (a reasoning
// item and the items after it go back together, as OpenAI checks), message
// text also as text parts, function_call items also as tool calls (the item
// linked to its call by call_id).
func OpenAIRecord(response []byte) (*sidecarv1.Record, error) {
	var body struct {
		Output []json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(response, &body); err != nil {
		return nil, fmt.Errorf("not a Responses API response: %w", err)
	}
	var content []*sidecarv1.ContentPart
	var calls []*sidecarv1.ToolCall
	for _, raw := range body.Output {
		var item struct {
			Type      string `json:"type"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
			Content   []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		}
		if err := json.Unmarshal(raw, &item); err != nil {
			return nil, fmt.Errorf("an output item of the response: %w", err)
		}
		callID := ""
		switch item.Type {
		case "message":
			for _, part := range item.Content {
				if part.Type == "output_text" && part.Text != "" {
					content = append(content, textPart(part.Text))
				}
			}
		case "function_call":
			callID = item.CallID
			calls = append(calls, &sidecarv1.ToolCall{CallId: callID, Name: item.Name, ArgumentsJson: item.Arguments})
		}
		content = append(content, providerBlock(sidecarv1.Provider_PROVIDER_OPENAI, raw, item.Type, callID))
	}
	return assistantRecord(content, calls), nil
}

// GeminiRecord is the assistant record of a generateContent response body's
// first candidate: thought parts and parts carrying a thoughtSignature kept
// in place as Gemini provider blocks (a signed functionCall linked to its
// call, a signed text part as type "text"), text as text parts, function
// calls as tool calls with the ids the host gives them (callIDs, one per
// functionCall, in order: Gemini's calls have none the other providers
// accept).
func GeminiRecord(response []byte, callIDs []string) (*sidecarv1.Record, error) {
	var body struct {
		Candidates []struct {
			Content struct {
				Parts []json.RawMessage `json:"parts"`
			} `json:"content"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal(response, &body); err != nil {
		return nil, fmt.Errorf("not a generateContent response: %w", err)
	}
	if len(body.Candidates) == 0 {
		return nil, fmt.Errorf("the response has no candidate")
	}
	type part struct {
		Text             *string `json:"text"`
		Thought          bool    `json:"thought"`
		ThoughtSignature string  `json:"thoughtSignature"`
		FunctionCall     *struct {
			Name string          `json:"name"`
			Args json.RawMessage `json:"args"`
		} `json:"functionCall"`
	}
	raws := body.Candidates[0].Content.Parts
	parts := make([]part, len(raws))
	functionCalls := 0
	for i, raw := range raws {
		if err := json.Unmarshal(raw, &parts[i]); err != nil {
			return nil, fmt.Errorf("a part of the response: %w", err)
		}
		if parts[i].FunctionCall != nil {
			functionCalls++
		}
	}
	if functionCalls != len(callIDs) {
		return nil, fmt.Errorf("callIDs must name every functionCall of the response, in order: %d calls, %d ids",
			functionCalls, len(callIDs))
	}
	var content []*sidecarv1.ContentPart
	var calls []*sidecarv1.ToolCall
	next := 0
	for i, p := range parts {
		callID := ""
		if p.FunctionCall != nil {
			callID = callIDs[next]
			next++
			args, err := arguments(p.FunctionCall.Args)
			if err != nil {
				return nil, fmt.Errorf("functionCall %s: %w", p.FunctionCall.Name, err)
			}
			calls = append(calls, &sidecarv1.ToolCall{CallId: callID, Name: p.FunctionCall.Name, ArgumentsJson: args})
		} else if p.Text != nil && !p.Thought {
			content = append(content, textPart(*p.Text))
		}
		if p.ThoughtSignature != "" || p.Thought {
			kind := "text"
			if p.Thought {
				kind = "thought"
			} else if callID != "" {
				kind = "functionCall"
			}
			content = append(content, providerBlock(sidecarv1.Provider_PROVIDER_GEMINI, raws[i], kind, callID))
		}
	}
	return assistantRecord(content, calls), nil
}
