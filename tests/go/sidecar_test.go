// Package polyglot_test drives a real psych-sidecar process from Go through
// the generated stubs, the way a Go agent host would: over a Unix socket,
// waiting for health with a bounded timeout, with a deadline on every call.
//
// The sidecar binary is $PSYCH_SIDECAR_BIN, or psych-sidecar on PATH.
package polyglot_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	readyTimeout = 20 * time.Second
	callTimeout  = 10 * time.Second
	exitTimeout  = 20 * time.Second
)

// lockedBuffer collects the sidecar's output, which its pipes write from
// other goroutines while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// sidecar is one psych-sidecar process with a fresh SQLite database.
type sidecar struct {
	cmd    *exec.Cmd
	output *lockedBuffer
	exited chan struct{} // closed when the process has exited
	err    error         // cmd.Wait's result, set before exited is closed
	conn   *grpc.ClientConn
}

func startSidecar(t *testing.T) *sidecar {
	t.Helper()
	bin := os.Getenv("PSYCH_SIDECAR_BIN")
	if bin == "" {
		bin = "psych-sidecar"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Fatalf("sidecar binary %q not found (set PSYCH_SIDECAR_BIN): %v", bin, err)
	}
	// Keep the socket path short: Unix socket paths are limited to ~107 bytes.
	dir, err := os.MkdirTemp("", "psgo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "s.sock")
	database := "sqlite:///" + filepath.Join(dir, "db.sqlite3") // sqlite:////abs/path

	s := &sidecar{output: &lockedBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(path, "serve", "--listen", "unix://"+socket, "--database-url", database)
	s.cmd.Stdout = s.output
	s.cmd.Stderr = s.output
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("sidecar output:\n%s", s.output.String())
		}
	})

	s.conn, err = grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { s.conn.Close() })
	s.waitServing(t)
	return s
}

// waitServing polls grpc.health.v1 Check(service="") until SERVING, for at
// most readyTimeout, failing early if the process exits.
func (s *sidecar) waitServing(t *testing.T) {
	t.Helper()
	health := healthpb.NewHealthClient(s.conn)
	deadline := time.Now().Add(readyTimeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			t.Fatalf("sidecar exited before it was ready: %v", s.err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: ""})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if err != nil {
			last = err.Error()
		} else {
			last = resp.GetStatus().String()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("sidecar not SERVING within %v; last answer: %s", readyTimeout, last)
}

// stop sends SIGTERM and waits, bounded, for the process to exit.
func (s *sidecar) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-s.exited:
	case <-time.After(exitTimeout):
		t.Fatalf("sidecar still running %v after SIGTERM", exitTimeout)
	}
	var exitErr *exec.ExitError
	if s.err != nil && !errors.As(s.err, &exitErr) {
		t.Fatalf("waiting for the sidecar: %v", s.err)
	}
	t.Logf("sidecar exited after SIGTERM: %v", s.cmd.ProcessState)
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("sidecar exit status after SIGTERM = %v, want 0 (a clean drain)", s.cmd.ProcessState)
	}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

func text(s string) *sidecarv1.ContentPart {
	return &sidecarv1.ContentPart{Kind: &sidecarv1.ContentPart_Text{Text: s}}
}

func TestRoundTripThroughGeneratedStubs(t *testing.T) {
	s := startSidecar(t)
	specs := sidecarv1.NewSpecServiceClient(s.conn)
	runs := sidecarv1.NewRunServiceClient(s.conn)

	published, err := specs.PublishSpec(callCtx(t), &sidecarv1.PublishSpecRequest{
		Spec: &sidecarv1.Spec{
			Name:         "go-agent",
			Version:      1,
			Instructions: "You are a Go host's test agent. Answer briefly.",
			Thresholds: &sidecarv1.Thresholds{
				PerResultTokens: proto.Int64(1000),
				PerBatchTokens:  proto.Int64(4000),
			},
		},
	})
	if err != nil {
		t.Fatalf("PublishSpec: %v", err)
	}
	if got := published.GetSpec(); got.GetName() != "go-agent" || got.GetVersion() != 1 ||
		got.GetThresholds().GetPerResultTokens() != 1000 || got.GetThresholds().GetPerBatchTokens() != 4000 {
		t.Errorf("PublishSpec returned %v", got)
	}

	created, err := runs.CreateRun(callCtx(t), &sidecarv1.CreateRunRequest{
		Tenant: "t1", SpecName: "go-agent", SpecVersion: 1,
	})
	if err != nil {
		t.Fatalf("CreateRun: %v", err)
	}
	runID := created.GetRun().GetRunId()
	if runID == "" {
		t.Fatalf("CreateRun returned no run_id: %v", created)
	}

	// Every byte value, so any text/encoding mangling of binary shows.
	png := make([]byte, 0, 264)
	png = append(png, 0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a)
	for i := 0; i < 256; i++ {
		png = append(png, byte(i))
	}
	sent := []*sidecarv1.Record{
		{Kind: &sidecarv1.Record_UserMessage{UserMessage: &sidecarv1.UserMessage{
			Content: []*sidecarv1.ContentPart{text("What's the weather in Oslo? ☔ — naïve")},
		}}},
		{Kind: &sidecarv1.Record_AssistantMessage{AssistantMessage: &sidecarv1.AssistantMessage{
			Content: []*sidecarv1.ContentPart{text("Let me check.")},
			ToolCalls: []*sidecarv1.ToolCall{{
				CallId:        "call_1",
				Name:          "weather__forecast",
				ArgumentsJson: `{"city": "Oslo",  "days":1}`,
			}},
		}}},
		{Kind: &sidecarv1.Record_ToolResult{ToolResult: &sidecarv1.ToolResult{
			CallId: "call_1",
			Tool:   "forecast",
			Content: []*sidecarv1.ContentPart{
				text("Rain, 7 °C."),
				{Kind: &sidecarv1.ContentPart_Binary{Binary: &sidecarv1.BinaryContent{
					MimeType: "image/png", Data: png,
				}}},
			},
		}}},
	}
	appendReq := &sidecarv1.AppendRecordsRequest{RunId: runID, RequestId: "go-append-1", Records: sent}

	first, err := runs.AppendRecords(callCtx(t), appendReq)
	if err != nil {
		t.Fatalf("AppendRecords: %v", err)
	}
	if len(first.GetRecords()) != 3 {
		t.Fatalf("AppendRecords returned %d records, want 3: %v", len(first.GetRecords()), first)
	}
	for i, r := range first.GetRecords() {
		if r.GetSequence() != int64(i+1) {
			t.Errorf("appended record %d: sequence %d, want %d", i, r.GetSequence(), i+1)
		}
	}
	if first.GetRecords()[2].GetHandle() == "" {
		t.Errorf("appended tool result has no handle")
	}
	for i := 0; i < 2; i++ {
		if h := first.GetRecords()[i].GetHandle(); h != "" {
			t.Errorf("appended record %d is not a tool result but has handle %q", i, h)
		}
	}

	listed := listAll(t, runs, runID)
	if len(listed) != 3 {
		t.Fatalf("ListRecords returned %d records, want 3", len(listed))
	}
	for i, got := range listed {
		if got.GetSequence() != int64(i+1) {
			t.Errorf("record %d: sequence %d, want %d", i, got.GetSequence(), i+1)
		}
		if got.GetRunId() != runID {
			t.Errorf("record %d: run_id %q, want %q", i, got.GetRunId(), runID)
		}
		if got.GetCreateTime() == nil {
			t.Errorf("record %d: no create_time", i)
		}
		// Compare the content only: run_id, sequence, create_time and handle
		// are output-only.
		content := proto.Clone(got).(*sidecarv1.Record)
		content.RunId, content.Sequence, content.CreateTime, content.Handle = "", 0, nil, ""
		if !proto.Equal(content, sent[i]) {
			t.Errorf("record %d content differs:\n got %v\nwant %v", i, content, sent[i])
		}
	}
	gotPNG := listed[2].GetToolResult().GetContent()[1].GetBinary().GetData()
	if !bytes.Equal(gotPNG, png) {
		t.Errorf("binary part not byte-identical: got %d bytes, want %d", len(gotPNG), len(png))
	}
	if h := listed[2].GetHandle(); h == "" || h != first.GetRecords()[2].GetHandle() {
		t.Errorf("listed tool result handle %q, appended handle %q", h, first.GetRecords()[2].GetHandle())
	}

	// A retry after a lost response: same request_id, same records.
	retry, err := runs.AppendRecords(callCtx(t), appendReq)
	if err != nil {
		t.Fatalf("AppendRecords retry: %v", err)
	}
	if !proto.Equal(retry, first) {
		t.Errorf("retried AppendRecords answered %v, first answer was %v", retry, first)
	}
	if n := len(listAll(t, runs, runID)); n != 3 {
		t.Errorf("after the retry ListRecords returned %d records, want 3", n)
	}
	got, err := runs.GetRun(callCtx(t), &sidecarv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	if got.GetRun().GetRunId() != runID || got.GetRun().GetTenant() != "t1" {
		t.Errorf("GetRun returned %v, want run %s of tenant t1", got.GetRun(), runID)
	}

	s.stop(t)
}

func listAll(t *testing.T, runs sidecarv1.RunServiceClient, runID string) []*sidecarv1.Record {
	t.Helper()
	var all []*sidecarv1.Record
	token := ""
	for page := 0; ; page++ {
		if page > 100 {
			t.Fatalf("ListRecords: no last page after 100 pages")
		}
		resp, err := runs.ListRecords(callCtx(t), &sidecarv1.ListRecordsRequest{RunId: runID, PageToken: token})
		if err != nil {
			t.Fatalf("ListRecords: %v", err)
		}
		all = append(all, resp.GetRecords()...)
		token = resp.GetNextPageToken()
		if token == "" {
			return all
		}
	}
}

func TestGetRunUnknownIsNotFoundWithErrorInfo(t *testing.T) {
	s := startSidecar(t)
	runs := sidecarv1.NewRunServiceClient(s.conn)

	const unknown = "run_does_not_exist"
	_, err := runs.GetRun(callCtx(t), &sidecarv1.GetRunRequest{RunId: unknown})
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.NotFound {
		t.Fatalf("GetRun(%q) error = %v, want code NotFound", unknown, err)
	}
	var infos []*errdetails.ErrorInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			infos = append(infos, d)
		case error:
			t.Errorf("undecodable status detail: %v", d)
		}
	}
	if len(infos) != 1 {
		t.Fatalf("want exactly one ErrorInfo detail, got %d in %s", len(infos), describe(st))
	}
	info := infos[0]
	if info.GetReason() != "RUN_NOT_FOUND" || info.GetDomain() != "psych.sidecar.v1" {
		t.Errorf("ErrorInfo = %v, want reason RUN_NOT_FOUND, domain psych.sidecar.v1", info)
	}
	if got := info.GetMetadata()["run_id"]; got != unknown {
		t.Errorf("ErrorInfo metadata run_id = %q, want %q", got, unknown)
	}
	// The reason is an ErrorReason value's name without its prefix.
	if _, ok := sidecarv1.ErrorReason_value["ERROR_REASON_"+info.GetReason()]; !ok {
		t.Errorf("reason %q is not in the ErrorReason catalogue", info.GetReason())
	}
}

func describe(st *status.Status) string {
	return fmt.Sprintf("status{code=%v message=%q details=%v}", st.Code(), st.Message(), st.Details())
}
