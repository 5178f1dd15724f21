package sidecarclient_test

// The Go host client against a real psych-sidecar process ($PSYCH_SIDECAR_BIN,
// or psych-sidecar on PATH). A response is lost by holding the sidecar's
// SQLite write lock with clients/testing/hold-sqlite-write-lock (python3).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sidecarclient "github.com/psych-sidecar/psych-sidecar/clients/go"
	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const readyTimeout = 30 * time.Second

// --- the sidecar process, shared by the tests ------------------------------------

type sidecarProcess struct {
	cmd      *exec.Cmd
	output   *bytes.Buffer
	dir      string
	unix     string
	tcp      string
	database string
}

var shared *sidecarProcess

func TestMain(m *testing.M) {
	s, err := startSidecar()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared = s
	code := m.Run()
	if err := s.stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "sidecar output:\n%s\n", s.output.String())
	}
	os.RemoveAll(s.dir)
	os.Exit(code)
}

func startSidecar() (*sidecarProcess, error) {
	bin := os.Getenv("PSYCH_SIDECAR_BIN")
	if bin == "" {
		bin = "psych-sidecar"
	}
	dir, err := os.MkdirTemp("", "pscl") // short: socket paths are limited to ~107 bytes
	if err != nil {
		return nil, err
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	tcp := listener.Addr().String()
	listener.Close()
	s := &sidecarProcess{
		output:   &bytes.Buffer{},
		dir:      dir,
		unix:     "unix://" + filepath.Join(dir, "s.sock"),
		tcp:      tcp,
		database: filepath.Join(dir, "db.sqlite3"),
	}
	s.cmd = exec.Command(bin, "serve", "--listen", s.unix, "--listen", tcp,
		"--database-url", "sqlite:///"+s.database, "--data-dir", dir)
	for _, entry := range os.Environ() {
		if !strings.HasPrefix(entry, "PSYCH_SIDECAR_") {
			s.cmd.Env = append(s.cmd.Env, entry)
		}
	}
	s.cmd.Stdout, s.cmd.Stderr = s.output, s.output
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (set PSYCH_SIDECAR_BIN): %w", bin, err)
	}
	// The client's own Dial waits for readiness once the socket file is there (Dial says at
	// once that a socket is missing).
	socketPath := strings.TrimPrefix(s.unix, "unix://")
	for deadline := time.Now().Add(readyTimeout); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(socketPath); err == nil || time.Now().After(deadline) {
			break
		}
	}
	client, err := sidecarclient.Dial(context.Background(), s.unix, sidecarclient.Options{ReadyTimeout: readyTimeout})
	if err != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
		return nil, fmt.Errorf("%w\n%s", err, s.output.String())
	}
	client.Close()
	return s, nil
}

func (s *sidecarProcess) stop() error {
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("sidecar exit after SIGTERM: %w", err)
		}
		return nil
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		return errors.New("sidecar still running 30 s after SIGTERM")
	}
}

// --- helpers -------------------------------------------------------------------

func dial(t *testing.T, address string, options sidecarclient.Options) *sidecarclient.Client {
	t.Helper()
	client, err := sidecarclient.Dial(context.Background(), address, options)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func newRun(t *testing.T, client *sidecarclient.Client) string {
	t.Helper()
	name := strings.ReplaceAll(t.Name(), "/", "-")
	ctx := context.Background()
	if _, err := client.Specs.PublishSpec(ctx, &sidecarv1.PublishSpecRequest{
		Spec: &sidecarv1.Spec{Name: name, Version: 1},
	}); err != nil {
		t.Fatal(err)
	}
	created, err := client.Runs.CreateRun(ctx, &sidecarv1.CreateRunRequest{Tenant: "t", SpecName: name, SpecVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	return created.GetRun().GetRunId()
}

func user(text string) *sidecarv1.Record {
	return &sidecarv1.Record{Kind: &sidecarv1.Record_UserMessage{UserMessage: &sidecarv1.UserMessage{
		Content: []*sidecarv1.ContentPart{{Kind: &sidecarv1.ContentPart_Text{Text: text}}},
	}}}
}

func toolResult(callID, text string) *sidecarv1.Record {
	return &sidecarv1.Record{Kind: &sidecarv1.Record_ToolResult{ToolResult: &sidecarv1.ToolResult{
		CallId:  callID,
		Content: []*sidecarv1.ContentPart{{Kind: &sidecarv1.ContentPart_Text{Text: text}}},
	}}}
}

func stored(t *testing.T, client *sidecarclient.Client, runID string) []*sidecarv1.Record {
	t.Helper()
	page, err := client.Runs.ListRecords(context.Background(), &sidecarv1.ListRecordsRequest{RunId: runID, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return page.GetRecords()
}

func sequences(records []*sidecarv1.AppendedRecord) []int64 {
	var out []int64
	for _, r := range records {
		out = append(out, r.GetSequence())
	}
	return out
}

// writeLock holds the sidecar's SQLite write lock: its appends wait until
// release, so a client's deadline expires while the append is still to be
// stored.
type writeLock struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	once  sync.Once
}

func holdWriteLock(t *testing.T) *writeLock {
	t.Helper()
	python := os.Getenv("PYTHON")
	if python == "" {
		python = "python3"
	}
	cmd := exec.Command(python, filepath.Join("..", "testing", "hold-sqlite-write-lock"), shared.database)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("hold-sqlite-write-lock said %q (%v)", line, err)
	}
	lock := &writeLock{cmd: cmd, stdin: stdin}
	t.Cleanup(lock.release)
	return lock
}

func (l *writeLock) release() {
	l.once.Do(func() {
		l.stdin.Close()
		l.cmd.Wait()
	})
}

type attempt struct {
	requestID string
	code      codes.Code
}

// appendAttempts records every AppendRecords attempt, and releases lock (when
// set) once the first has failed with DEADLINE_EXCEEDED: that response is
// lost, the append then completes in the sidecar, and the retry must find it.
type appendAttempts struct {
	mu       sync.Mutex
	lock     *writeLock
	attempts []attempt
}

func (a *appendAttempts) intercept(ctx context.Context, method string, req, reply any,
	conn *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, conn, opts...)
	if strings.HasSuffix(method, "/AppendRecords") {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.attempts = append(a.attempts, attempt{req.(*sidecarv1.AppendRecordsRequest).GetRequestId(), status.Code(err)})
		if a.lock != nil && status.Code(err) == codes.DeadlineExceeded {
			a.lock.release()
		}
	}
	return err
}

func (a *appendAttempts) option() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(a.intercept)
}

// --- tests -----------------------------------------------------------------------

func TestDialReachesAUnixSocketOrATCPAddress(t *testing.T) {
	for _, address := range []string{shared.unix, shared.tcp} {
		client := dial(t, address, sidecarclient.Options{ReadyTimeout: 5 * time.Second})
		runID := newRun(t, client)
		got, err := client.Runs.GetRun(context.Background(), &sidecarv1.GetRunRequest{RunId: runID})
		if err != nil || got.GetRun().GetRunId() != runID {
			t.Errorf("%s: GetRun = %v, %v", address, got, err)
		}
	}
}

func TestDialGivesUpAfterTheReadyTimeout(t *testing.T) {
	// A socket nobody answers on (listening, never accepting): Dial waits, then gives up.
	path := filepath.Join(shortTempDir(t), "nobody.sock")
	listener, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	address := "unix://" + path
	_, err = sidecarclient.Dial(context.Background(), address, sidecarclient.Options{ReadyTimeout: 500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "not SERVING within 500ms") {
		t.Fatalf("Dial = %v, want a readiness timeout", err)
	}
}

func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "pscl") // short: socket paths are limited to ~107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// Before: 20 s of retries, then "not SERVING (Unavailable)", the path never named. The
// ready timeout here is an hour: only an answer at once passes.
func TestDialNamesAMissingSocketAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nobody.sock")
	_, err := sidecarclient.Dial(context.Background(), "unix://"+path, sidecarclient.Options{ReadyTimeout: time.Hour})
	want := "no socket at " + path + " (from unix://" + path + "): is the sidecar running, and listening there?"
	if err == nil || err.Error() != want || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Dial = %v, want %q", err, want)
	}
	cwd, _ := os.Getwd()
	_, err = sidecarclient.Dial(context.Background(), "unix:psych-sidecar-data/sidecar.sock", sidecarclient.Options{ReadyTimeout: time.Hour})
	if err == nil || !strings.HasPrefix(err.Error(), "no socket at "+filepath.Join(cwd, "psych-sidecar-data", "sidecar.sock")+" (from unix:psych-sidecar-data/sidecar.sock): the directory ") {
		t.Fatalf("Dial of a relative path = %v", err)
	}
}

func TestDialSaysAtOnceWhatIsWrongWithAnAddress(t *testing.T) {
	notSocket := filepath.Join(t.TempDir(), "sidecar.sock")
	if err := os.WriteFile(notSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for address, want := range map[string]string{
		"":                                "no sidecar address: give the one scripts/serve prints",
		"/run/psych/sidecar.sock":         "/run/psych/sidecar.sock is a socket path without unix: in front: write unix:/run/psych/sidecar.sock",
		"psych-sidecar-data/sidecar.sock": "write unix:psych-sidecar-data/sidecar.sock",
		"unix:" + notSocket:               notSocket + " (from unix:" + notSocket + ") is not a socket",
	} {
		_, err := sidecarclient.Dial(context.Background(), address, sidecarclient.Options{ReadyTimeout: time.Hour})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Dial(%q) = %v, want %q", address, err, want)
		}
	}
}

func TestAnErrorInfoBecomesAnErrorReasonToSwitchOn(t *testing.T) {
	client := dial(t, shared.unix, sidecarclient.Options{})
	_, err := client.Runs.GetRun(context.Background(), &sidecarv1.GetRunRequest{RunId: "run_nope"})
	switch sidecarclient.ReasonOf(err) {
	case sidecarv1.ErrorReason_ERROR_REASON_RUN_NOT_FOUND:
	default:
		t.Fatalf("ReasonOf(%v) = %v, want RUN_NOT_FOUND", err, sidecarclient.ReasonOf(err))
	}
	e, ok := sidecarclient.AsError(err)
	if !ok || e.Code != codes.NotFound || e.ReasonName != "RUN_NOT_FOUND" || e.Metadata["run_id"] != "run_nope" {
		t.Errorf("error = %#v", e)
	}
	if status.Code(err) != codes.NotFound {
		t.Errorf("status.Code = %v, want NotFound", status.Code(err))
	}

	_, err = client.Runs.CreateRun(context.Background(), &sidecarv1.CreateRunRequest{SpecName: "x"})
	if e, _ := sidecarclient.AsError(err); sidecarclient.ReasonOf(err) != sidecarv1.ErrorReason_ERROR_REASON_FIELD_REQUIRED || e.Metadata["field"] != "tenant" {
		t.Errorf("CreateRun without tenant: %v", err)
	}
}

func TestEveryCallHasADeadline(t *testing.T) {
	client := dial(t, shared.unix, sidecarclient.Options{CallTimeout: 500 * time.Millisecond})
	runID := newRun(t, client)
	holdWriteLock(t)
	_, err := client.Runs.AppendRecords(context.Background(), &sidecarv1.AppendRecordsRequest{
		RunId: runID, Records: []*sidecarv1.Record{user("hi")},
	})
	e, ok := sidecarclient.AsError(err)
	if !ok || e.Code != codes.DeadlineExceeded {
		t.Fatalf("AppendRecords under a held lock = %v, want DeadlineExceeded", err)
	}
	// gRPC's own failure: no ErrorInfo, so no reason.
	if e.Reason != sidecarv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		t.Errorf("reason = %v, want UNSPECIFIED", e.Reason)
	}
}

func TestALostAppendResponseIsRetriedWithItsRequestIDAndStoredOnce(t *testing.T) {
	spy := &appendAttempts{}
	client := dial(t, shared.unix, sidecarclient.Options{
		CallTimeout: time.Second, AppendAttempts: 5, DialOptions: []grpc.DialOption{spy.option()},
	})
	runID := newRun(t, client)
	spy.lock = holdWriteLock(t)
	request := &sidecarv1.AppendRecordsRequest{
		RunId: runID, RequestId: "turn-1", Records: []*sidecarv1.Record{user("hi"), toolResult("c1", "ok")},
	}
	answer, err := client.AppendRecords(context.Background(), request)
	if err != nil {
		t.Fatal(err)
	}
	if len(spy.attempts) < 2 || spy.attempts[0].code != codes.DeadlineExceeded || spy.attempts[len(spy.attempts)-1].code != codes.OK {
		t.Fatalf("attempts = %v, want a lost first response, then an answer", spy.attempts)
	}
	for _, a := range spy.attempts {
		if a.requestID != "turn-1" {
			t.Errorf("an attempt used request id %q", a.requestID)
		}
	}
	if got := sequences(answer.GetRecords()); fmt.Sprint(got) != "[1 2]" || answer.GetRecords()[1].GetHandle() == "" {
		t.Fatalf("answer = %v", answer)
	}
	records := stored(t, client, runID)
	if len(records) != 2 || records[1].GetHandle() != answer.GetRecords()[1].GetHandle() {
		t.Fatalf("stored %v", records)
	}
	again, err := client.AppendRecords(context.Background(), request)
	if err != nil || !proto.Equal(again, answer) {
		t.Errorf("asked again: %v, %v; first answer %v", again, err, answer)
	}
	if n := len(stored(t, client, runID)); n != 2 {
		t.Errorf("stored %d records, want 2", n)
	}
}

func TestARequestWithoutAnIDGetsOneThatEveryAttemptReuses(t *testing.T) {
	spy := &appendAttempts{}
	client := dial(t, shared.unix, sidecarclient.Options{
		CallTimeout: time.Second, AppendAttempts: 5, DialOptions: []grpc.DialOption{spy.option()},
	})
	runID := newRun(t, client)
	spy.lock = holdWriteLock(t)
	request := &sidecarv1.AppendRecordsRequest{RunId: runID, Records: []*sidecarv1.Record{user("hi")}}
	answer, err := client.AppendRecords(context.Background(), request)
	if err != nil {
		t.Fatal(err)
	}
	if len(spy.attempts) < 2 {
		t.Fatalf("attempts = %v, want a retry", spy.attempts)
	}
	for _, a := range spy.attempts {
		if a.requestID == "" || a.requestID != spy.attempts[0].requestID {
			t.Errorf("attempts = %v, want one non-empty request id", spy.attempts)
		}
	}
	if request.GetRequestId() != "" {
		t.Errorf("the caller's request was changed")
	}
	if got := sequences(answer.GetRecords()); fmt.Sprint(got) != "[1]" {
		t.Errorf("answer = %v", answer)
	}
	if n := len(stored(t, client, runID)); n != 1 {
		t.Errorf("stored %d records, want 1", n)
	}
}

func TestAppendRetriesAreBoundedAndNeverStoreTwice(t *testing.T) {
	spy := &appendAttempts{}
	client := dial(t, shared.unix, sidecarclient.Options{
		CallTimeout: 300 * time.Millisecond, AppendAttempts: 3, DialOptions: []grpc.DialOption{spy.option()},
	})
	runID := newRun(t, client)
	lock := holdWriteLock(t)
	request := &sidecarv1.AppendRecordsRequest{RunId: runID, RequestId: "turn-1", Records: []*sidecarv1.Record{user("hi")}}
	_, err := client.AppendRecords(context.Background(), request)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("AppendRecords = %v, want DeadlineExceeded after the last attempt", err)
	}
	if fmt.Sprint(spy.attempts) != fmt.Sprint([]attempt{{"turn-1", codes.DeadlineExceeded}, {"turn-1", codes.DeadlineExceeded}, {"turn-1", codes.DeadlineExceeded}}) {
		t.Fatalf("attempts = %v, want three timed out", spy.attempts)
	}
	// Three abandoned attempts are still waiting in the sidecar; they store once.
	lock.release()
	answer, err := client.AppendRecords(context.Background(), request)
	if err != nil || fmt.Sprint(sequences(answer.GetRecords())) != "[1]" {
		t.Fatalf("after release: %v, %v", answer, err)
	}
	if n := len(stored(t, client, runID)); n != 1 {
		t.Errorf("stored %d records, want 1", n)
	}
}

func TestAnErrorTheSidecarAnsweredIsNotRetried(t *testing.T) {
	spy := &appendAttempts{}
	client := dial(t, shared.unix, sidecarclient.Options{AppendAttempts: 5, DialOptions: []grpc.DialOption{spy.option()}})
	_, err := client.AppendRecords(context.Background(), &sidecarv1.AppendRecordsRequest{
		RunId: "run_nope", RequestId: "turn-1", Records: []*sidecarv1.Record{user("hi")},
	})
	if sidecarclient.ReasonOf(err) != sidecarv1.ErrorReason_ERROR_REASON_RUN_NOT_FOUND {
		t.Fatalf("AppendRecords = %v, want RUN_NOT_FOUND", err)
	}
	if len(spy.attempts) != 1 {
		t.Errorf("attempts = %v, want one", spy.attempts)
	}
}
