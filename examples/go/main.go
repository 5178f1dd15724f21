// Command example is a complete agent host in Go: the loop a host runs
// against psych-sidecar, with a scripted model standing in for the LLM, so it
// needs no network and no API key (model.go).
//
//	PSYCH_SIDECAR_ADDRESS=unix:///path/to/sidecar.sock go run .
//
// The sidecar must allow the project's MCP fixture server as the stdio command
// "fixture" and @modelcontextprotocol/server-everything as "everything"
// (examples/sidecar.toml; examples/README.md shows how to start one). The host
// publishes a Spec, connects both servers deferred (their tools stay out of
// the prompt, behind the meta tools), creates a Run and plays three user
// turns. Per turn: AppendRecords (the user message), ResolveTurn, then per
// model call AssemblePrompt → the model decides, answering as a thinking model
// on Anthropic's Messages API does → RecordUsage → AppendRecords (the
// assistant message, from the response with sidecarclient.AnthropicRecord,
// its thinking kept byte for byte) → DispatchToolCall for each tool call,
// until the model answers without tools. Then the host itself reads the elided result
// back (ReadToolOutput) and decodes the ErrorInfo of a deliberate mistake.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	sidecarclient "github.com/psych-sidecar/psych-sidecar/clients/go"
	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
	"google.golang.org/protobuf/proto"
)

const (
	tenant      = "example-go"
	specName    = "example-go-host"
	server      = "fixture"
	everything  = "everything" // a third-party Node MCP server, pinned in tests/mcp-peers/package.json
	specVersion = 3
	modelName   = "scripted-model"
	memoryTail  = "Memory: the user likes short answers."
)

// userTurns are what the user says, one turn each.
var userTurns = []string{
	"Fetch the fixture server's 20000-character report and tell me how long it is.",
	"What comes right after the part of the report you can still see?",
	"Thanks, that is all.",
}

func main() {
	log.SetFlags(0)
	address := os.Getenv("PSYCH_SIDECAR_ADDRESS")
	if address == "" {
		log.Fatal("set PSYCH_SIDECAR_ADDRESS to the sidecar's address, e.g. unix:///tmp/sidecar.sock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := sidecarclient.Dial(ctx, address, sidecarclient.Options{ReadyTimeout: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	h := &host{client: client, shownElided: map[string]bool{}}
	if err := h.setUp(ctx); err != nil {
		log.Fatal(err)
	}
	for number, text := range userTurns {
		if err := h.turn(ctx, number+1, text); err != nil {
			log.Fatal(err)
		}
	}
	if err := h.readBack(ctx); err != nil {
		log.Fatal(err)
	}
	if err := h.deliberateError(ctx); err != nil {
		log.Fatal(err)
	}
	if err := h.report(ctx); err != nil {
		log.Fatal(err)
	}
}

type host struct {
	client      *sidecarclient.Client
	runID       string
	calls       int
	thinking    int // thinking blocks appended, each to be sent back in every later body
	shownElided map[string]bool
	elided      string // the handle of the first elided result
}

// setUp publishes the Spec, connects the MCP server and creates the Run.
func (h *host) setUp(ctx context.Context) error {
	// Thresholds this small elide the 20000-character result (5000 estimated
	// tokens) from every turn after the one that asked for it. Publishing the
	// same content again succeeds, so the example can run twice.
	spec := &sidecarv1.Spec{
		Name:         specName,
		Version:      specVersion,
		Instructions: "You answer questions using the tools of the fixture server.",
		Thresholds: &sidecarv1.Thresholds{
			PerResultTokens:  proto.Int64(1000),
			PerBatchTokens:   proto.Int64(4000),
			PreviewHeadChars: proto.Int32(200),
			PreviewTailChars: proto.Int32(100),
		},
		Grants: []*sidecarv1.ToolGrant{
			{ServerPattern: server, ToolPattern: "*"},
			{ServerPattern: everything, ToolPattern: "*"},
		},
		// The Anthropic body asks for adaptive thinking, as Claude's current models run agents.
		Reasoning: &sidecarv1.ReasoningSettings{AnthropicThinking: sidecarv1.AnthropicThinking_ANTHROPIC_THINKING_ADAPTIVE},
	}
	if _, err := h.client.Specs.PublishSpec(ctx, &sidecarv1.PublishSpecRequest{Spec: spec}); err != nil {
		if sidecarclient.ReasonOf(err) == sidecarv1.ErrorReason_ERROR_REASON_SPEC_VERSION_EXISTS {
			return fmt.Errorf("%s v%d was published with other content: bump the version (%w)", specName, specVersion, err)
		}
		return err
	}
	fmt.Printf("published spec %s v%d: results of 1000 estimated tokens or more are elided on later turns\n", specName, specVersion)

	if err := h.connectStdio(ctx, server, "fixture", []string{"--tools", "0"}, "The project's MCP test server."); err != nil {
		return err
	}
	if err := h.connectStdio(ctx, everything, "everything", nil, "The MCP reference server: a bit of everything."); err != nil {
		return err
	}

	created, err := h.client.Runs.CreateRun(ctx, &sidecarv1.CreateRunRequest{
		Tenant: tenant, SpecName: specName, SpecVersion: specVersion,
	})
	if err != nil {
		return err
	}
	h.runID = created.GetRun().GetRunId()
	fmt.Printf("created run %s\n", h.runID)
	listed, err := h.client.Tools.ListServerTools(ctx, &sidecarv1.ListServerToolsRequest{
		RunId: h.runID, Server: everything, PageSize: 100,
	})
	if err != nil {
		return err
	}
	names := listed.GetToolNames()
	fmt.Printf("%s offers the run %d tools: %s, …\n", everything, len(names), strings.Join(names[:min(4, len(names))], ", "))
	return nil
}

// connectStdio connects an MCP server over stdio, by the name of a command the sidecar allows.
func (h *host) connectStdio(ctx context.Context, name, command string, args []string, description string) error {
	put, err := h.client.Connections.PutConnection(ctx, &sidecarv1.PutConnectionRequest{
		Connection: &sidecarv1.Connection{
			Tenant:      tenant,
			Name:        name,
			Transport:   &sidecarv1.Connection_Stdio{Stdio: &sidecarv1.StdioTransport{Command: command, Args: args}},
			Preload:     proto.Bool(false),
			Description: description,
		},
	})
	if err != nil {
		return err
	}
	connection := put.GetConnection()
	if connection.GetState() != sidecarv1.ConnectionState_CONNECTION_STATE_CONNECTED {
		return fmt.Errorf("%s did not connect: %s %s", name, connection.GetState(), connection.GetLastError())
	}
	fmt.Printf("connected MCP server %s over stdio: %s, catalogue version %d, deferred\n",
		name, strings.TrimPrefix(connection.GetState().String(), "CONNECTION_STATE_"), connection.GetCatalogVersion())
	return nil
}

// readBack reads the elided result back itself, by its handle, as a UI showing it in full would.
func (h *host) readBack(ctx context.Context) error {
	read, err := h.client.Tools.ReadToolOutput(ctx, &sidecarv1.ReadToolOutputRequest{
		RunId: h.runID, Handle: h.elided, Offset: 19950, Limit: 100,
	})
	if err != nil {
		return err
	}
	fmt.Printf("host read-back: ReadToolOutput %s offset 19950 -> %d characters of %d, next offset %d\n",
		h.elided, len([]rune(read.GetText())), read.GetTotalLength(), read.GetNextOffset())
	return nil
}

// deliberateError makes a mistake on purpose, to show the one google.rpc.ErrorInfo every error carries.
func (h *host) deliberateError(ctx context.Context) error {
	_, err := h.client.Tools.ReadToolOutput(ctx, &sidecarv1.ReadToolOutputRequest{
		RunId: h.runID, Handle: h.elided, Grep: "(",
	})
	var failure *sidecarclient.Error
	if !errors.As(err, &failure) || failure.Reason != sidecarv1.ErrorReason_ERROR_REASON_PATTERN_INVALID {
		return fmt.Errorf("an invalid grep pattern: want PATTERN_INVALID, got %v", err)
	}
	metadata, _ := json.Marshal(failure.Metadata)
	fmt.Printf("deliberate error: ReadToolOutput grep \"(\" -> %s %s %s: %s\n",
		failure.Code, failure.ReasonName, metadata, failure.Message)
	return nil
}

// turn plays one user turn to the model's final answer.
func (h *host) turn(ctx context.Context, number int, text string) error {
	fmt.Printf("\n== turn %d\nuser: %s\n", number, text)
	if _, err := h.client.AppendRecords(ctx, &sidecarv1.AppendRecordsRequest{
		RunId: h.runID, RequestId: fmt.Sprintf("turn-%d-user", number),
		Records: []*sidecarv1.Record{{Kind: &sidecarv1.Record_UserMessage{UserMessage: &sidecarv1.UserMessage{
			Content: []*sidecarv1.ContentPart{{Kind: &sidecarv1.ContentPart_Text{Text: text}}},
		}}}},
	}); err != nil {
		return err
	}
	resolved, err := h.client.Turns.ResolveTurn(ctx, &sidecarv1.ResolveTurnRequest{RunId: h.runID})
	if err != nil {
		return err
	}
	var names []string
	for _, tool := range resolved.GetSurface().GetTools() {
		names = append(names, tool.GetName())
	}
	fmt.Printf("tools this turn: %s\n", strings.Join(names, ", "))
	for _, line := range resolved.GetSurface().GetServers() {
		fmt.Printf("server line: %s\n", line.GetText())
	}

	for step := 1; ; step++ {
		assembled, err := h.client.Turns.AssemblePrompt(ctx, &sidecarv1.AssemblePromptRequest{
			RunId: h.runID, DynamicTail: memoryTail, Model: modelName, MaxTokens: 1024,
		})
		if err != nil {
			return err
		}
		h.show(fmt.Sprintf("%d.%d", number, step), assembled)
		// The body a host sends as it is: the thinking of every earlier step is back in it.
		body := sidecarclient.RequestBody(assembled, sidecarv1.Provider_PROVIDER_ANTHROPIC)
		if kept := bytes.Count(body, []byte(thinkingBlock)); kept != h.thinking {
			return fmt.Errorf("the Anthropic body carries %d of the %d thinking blocks appended", kept, h.thinking)
		}

		decision, err := decide(assembled)
		if err != nil {
			return err
		}
		// The provider reports usage with its answer; the host records it as reported.
		if _, err := h.client.Usage.RecordUsage(ctx, &sidecarv1.RecordUsageRequest{
			RunId: h.runID, RequestId: fmt.Sprintf("turn-%d-step-%d", number, step), Model: modelName,
			InputTokens: decision.inputTokens, OutputTokens: decision.outputTokens,
		}); err != nil {
			return err
		}
		// The response as a thinking model sends it, and the record to append: its thinking
		// block as a provider block, byte for byte, its tool_use blocks as tool calls.
		var ids []string
		for range decision.calls {
			h.calls++
			ids = append(ids, fmt.Sprintf("call_%d", h.calls))
		}
		record, err := sidecarclient.AnthropicRecord(messagesResponse(decision, ids))
		if err != nil {
			return err
		}
		if _, err := h.client.AppendRecords(ctx, &sidecarv1.AppendRecordsRequest{
			RunId: h.runID, RequestId: fmt.Sprintf("turn-%d-step-%d", number, step),
			Records: []*sidecarv1.Record{record},
		}); err != nil {
			return err
		}
		h.thinking++
		assistant := record.GetAssistantMessage()
		if len(assistant.ToolCalls) == 0 {
			fmt.Printf("assistant: %s\n", decision.text)
			return nil
		}
		for _, call := range assistant.ToolCalls {
			if err := h.dispatch(ctx, call); err != nil {
				return err
			}
		}
	}
}

// show prints the prompt's per-zone sizes, and each elided result the first
// time the prompt shows it.
func (h *host) show(label string, assembled *sidecarv1.AssemblePromptResponse) {
	var parts []string
	var total int64
	for _, zone := range assembled.GetZones() {
		name := strings.ToLower(strings.TrimPrefix(zone.GetZone().String(), "PROMPT_ZONE_"))
		parts = append(parts, fmt.Sprintf("%s %d", name, zone.GetByteLength()))
		total += zone.GetByteLength()
	}
	fmt.Printf("prompt %s zone bytes: %s (total %d)\n", label, strings.Join(parts, " | "), total)
	for _, message := range assembled.GetPrompt().GetHistory() {
		for _, part := range message.GetParts() {
			result := part.GetToolResult()
			if result == nil || !result.GetElided() || h.shownElided[result.GetHandle()] {
				continue
			}
			h.shownElided[result.GetHandle()] = true
			if h.elided == "" {
				h.elided = result.GetHandle()
			}
			fmt.Printf("elided result: %s is shown as a %d-character preview with handle %s\n",
				result.GetCallId(), len([]rune(contentText(result.GetContent()))), result.GetHandle())
		}
	}
}

// dispatch hands one tool call to the sidecar, which runs it (a meta tool, an
// MCP tool, read_tool_output) and appends its result to the Run's log.
func (h *host) dispatch(ctx context.Context, call *sidecarv1.ToolCall) error {
	dispatched, err := h.client.Tools.DispatchToolCall(ctx, &sidecarv1.DispatchToolCallRequest{RunId: h.runID, Call: call})
	if err != nil {
		return err
	}
	if dispatched.GetDisposition() != sidecarv1.DispatchDisposition_DISPATCH_DISPOSITION_EXECUTED {
		// A host-local tool: this host has none.
		return fmt.Errorf("%s is not the sidecar's, and this host has no tool of that name", call.GetName())
	}
	outcome := dispatched.GetOutcome()
	var result struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(outcome.GetResultJson(), &result); err != nil {
		return fmt.Errorf("the result of %s is not MCP CallToolResult JSON: %w", call.GetName(), err)
	}
	var text strings.Builder
	for _, block := range result.Content {
		text.WriteString(block.Text)
	}
	characters := len([]rune(text.String()))
	switch call.GetName() {
	case "mcp_call_tool":
		fmt.Printf("deferred call: %s %s -> %d characters, is_error %t, stored as sequence %d with handle %s\n",
			call.GetName(), call.GetArgumentsJson(), characters, outcome.GetIsError(), outcome.GetSequence(), outcome.GetHandle())
	case "read_tool_output":
		fmt.Printf("read-back: %s %s -> %q\n", call.GetName(), call.GetArgumentsJson(), text.String())
	default:
		fmt.Printf("tool call: %s %s -> %d characters\n", call.GetName(), call.GetArgumentsJson(), characters)
	}
	if outcome.GetIsError() {
		return fmt.Errorf("%s failed: %s", call.GetName(), text.String())
	}
	return nil
}

// report prints the Run's usage, as the provider reported it.
func (h *host) report(ctx context.Context) error {
	usage, err := h.client.Usage.GetRunUsage(ctx, &sidecarv1.GetRunUsageRequest{RunId: h.runID})
	if err != nil {
		return err
	}
	totals := usage.GetTotals()
	fmt.Printf("\nusage: %d model calls, %d input and %d output tokens\n",
		totals.GetModelCalls(), totals.GetInputTokens(), totals.GetOutputTokens())
	fmt.Printf("thinking: %d thinking blocks appended, each sent back byte for byte in every later Anthropic body\n", h.thinking)
	return nil
}
