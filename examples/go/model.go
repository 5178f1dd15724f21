package main

// The scripted model: what an LLM would decide, written as fixed rules keyed on
// what the prompt shows. It reads nothing but the assembled prompt, as a model
// would, and it reports usage the way a provider does.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
)

// reportSize is how many characters the model asks the fixture's huge_text for.
const reportSize = 20000

// readBackLimit is how many characters the model reads back.
const readBackLimit = 60

// guidance finds the handle and the offset after the head in an elided view.
var guidance = regexp.MustCompile(`read_tool_output\(handle="([^"]+)"\): offset (\d+) continues after the head`)

// continuation is the note read_tool_output ends a partial read with.
var continuation = regexp.MustCompile(`\n\[Characters \d+ to \d+ of \d+: continue with offset \d+\.\]$`)

type decision struct {
	// The answer's text, when the model answers.
	text string
	// The tool calls, when it calls tools; the host assigns their ids.
	calls []*sidecarv1.ToolCall
	// Usage as the provider reports it.
	inputTokens, outputTokens int64
}

// decide is one model call.
func decide(assembled *sidecarv1.AssemblePromptResponse) (decision, error) {
	prompt := assembled.GetPrompt()
	history := prompt.GetHistory()
	if len(history) == 0 {
		return decision{}, fmt.Errorf("the prompt has no history")
	}
	d, err := next(prompt, history[len(history)-1])
	if err != nil {
		return decision{}, err
	}
	// A stand-in for the provider's token counts: about four bytes a token.
	for _, zone := range assembled.GetZones() {
		d.inputTokens += zone.GetByteLength() / 4
	}
	d.outputTokens = int64(len(d.text)/4 + 20*len(d.calls))
	return d, nil
}

func next(prompt *sidecarv1.Prompt, last *sidecarv1.PromptMessage) (decision, error) {
	if results := toolResults(last); len(results) > 0 {
		return afterToolResult(prompt, results[len(results)-1])
	}
	said := contentText(partsContent(last))
	switch {
	case strings.Contains(said, "report") && strings.Contains(said, "Fetch"):
		// The user means the fixture server, which is deferred: the prompt shows
		// only its line, so the model first lists what it may call there.
		for _, line := range prompt.GetTools().GetServers() {
			if line.GetTier() == sidecarv1.DisclosureTier_DISCLOSURE_TIER_DEFERRED &&
				strings.Contains(said, line.GetServer()+" server") {
				return call("mcp_list_tools", map[string]any{"server": line.GetServer()}), nil
			}
		}
		return decision{}, fmt.Errorf("the prompt shows no deferred server the user named")
	case strings.Contains(said, "after the part"):
		// The result of the earlier turn is elided now: the guidance in its
		// view says which handle to read and where the head ends.
		for _, message := range prompt.GetHistory() {
			for _, result := range toolResults(message) {
				if !result.GetElided() {
					continue
				}
				found := guidance.FindStringSubmatch(contentText(result.GetContent()))
				if found == nil {
					return decision{}, fmt.Errorf("the elided view of %s has no read_tool_output guidance", result.GetCallId())
				}
				offset, _ := strconv.Atoi(found[2])
				return call("read_tool_output", map[string]any{"handle": found[1], "offset": offset, "limit": readBackLimit}), nil
			}
		}
		return decision{}, fmt.Errorf("the prompt shows no elided result")
	default:
		return decision{text: "Glad to help."}, nil
	}
}

func afterToolResult(prompt *sidecarv1.Prompt, result *sidecarv1.PromptToolResult) (decision, error) {
	text := contentText(result.GetContent())
	if result.GetIsError() {
		return decision{}, fmt.Errorf("a tool failed: %s", text)
	}
	switch calledTool(prompt, result.GetCallId()) {
	case "mcp_list_tools":
		var listed struct {
			Server string   `json:"server"`
			Tools  []string `json:"tools"`
		}
		if err := json.Unmarshal([]byte(text), &listed); err != nil {
			return decision{}, fmt.Errorf("mcp_list_tools answered %q: %w", text, err)
		}
		if !slices.Contains(listed.Tools, "huge_text") {
			return decision{}, fmt.Errorf("%s has no huge_text tool: %v", listed.Server, listed.Tools)
		}
		return call("mcp_call_tool", map[string]any{
			"server": listed.Server, "tool": "huge_text", "input": map[string]any{"size": reportSize},
		}), nil
	case "mcp_call_tool":
		return decision{text: fmt.Sprintf("The report is %d characters long.", len([]rune(text)))}, nil
	case "read_tool_output":
		return decision{text: fmt.Sprintf("Right after the preview it goes on with %q.",
			continuation.ReplaceAllString(text, ""))}, nil
	}
	return decision{}, fmt.Errorf("the script has no move after %s", result.GetCallId())
}

// thinkingBlock is the scripted model's thinking, as a thinking model's
// response carries it: its signature is what Anthropic checks when the block
// comes back, so the host must send it back as it came.
const thinkingBlock = `{"type":"thinking","thinking":"The script says what comes next.","signature":"c2NyaXB0ZWQtbW9kZWw="}`

// messagesResponse is the decision as a Messages API response with thinking:
// the thinking block, then the text, then a tool_use block per call with the
// ids given.
func messagesResponse(d decision, ids []string) []byte {
	blocks := []string{thinkingBlock}
	if d.text != "" {
		text, _ := json.Marshal(map[string]string{"type": "text", "text": d.text})
		blocks = append(blocks, string(text))
	}
	for i, c := range d.calls {
		name, _ := json.Marshal(c.GetName())
		blocks = append(blocks, fmt.Sprintf(`{"type":"tool_use","id":%q,"name":%s,"input":%s}`, ids[i], name, c.GetArgumentsJson()))
	}
	stop := "end_turn"
	if len(d.calls) > 0 {
		stop = "tool_use"
	}
	return []byte(fmt.Sprintf(`{"id":"msg_scripted","type":"message","role":"assistant","model":%q,"content":[%s],"stop_reason":%q}`,
		modelName, strings.Join(blocks, ","), stop))
}

func call(name string, arguments map[string]any) decision {
	encoded, _ := json.Marshal(arguments)
	return decision{calls: []*sidecarv1.ToolCall{{Name: name, ArgumentsJson: string(encoded)}}}
}

// calledTool is the name of the tool the history's call with that id called.
func calledTool(prompt *sidecarv1.Prompt, callID string) string {
	for _, message := range prompt.GetHistory() {
		for _, part := range message.GetParts() {
			if toolCall := part.GetToolCall(); toolCall != nil && toolCall.GetCallId() == callID {
				return toolCall.GetName()
			}
		}
	}
	return ""
}

func toolResults(message *sidecarv1.PromptMessage) []*sidecarv1.PromptToolResult {
	var results []*sidecarv1.PromptToolResult
	for _, part := range message.GetParts() {
		if result := part.GetToolResult(); result != nil {
			results = append(results, result)
		}
	}
	return results
}

func partsContent(message *sidecarv1.PromptMessage) []*sidecarv1.ContentPart {
	var content []*sidecarv1.ContentPart
	for _, part := range message.GetParts() {
		if c := part.GetContent(); c != nil {
			content = append(content, c)
		}
	}
	return content
}

// contentText is what a model reads of some content: text and JSON parts.
func contentText(parts []*sidecarv1.ContentPart) string {
	var text strings.Builder
	for _, part := range parts {
		text.WriteString(part.GetText())
		text.Write(part.GetJson())
	}
	return text.String()
}
