package contract

// The Go contract runner: every scenario of tests/contract/scenarios/
// through the generated Go clients, against a psych-sidecar process, over a
// Unix socket and loopback TCP. The sidecar binary is $PSYCH_SIDECAR_BIN, or
// psych-sidecar on PATH.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
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
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

const (
	contractDir     = ".."
	maxMessageBytes = 1048576
	readyTimeout    = 30 * time.Second
	stopTimeout     = 30 * time.Second
	countsEnv       = "PSYCH_CONTRACT_COUNTS"
)

// codeNames are the canonical gRPC status names, by code number.
var codeNames = []string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
	"ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
	"UNAUTHENTICATED",
}

func codeName(code codes.Code) string {
	if int(code) < len(codeNames) {
		return codeNames[code]
	}
	return code.String()
}

// generatedClients is every service of the contract, by its short name, as
// its generated client.
func generatedClients(conn *grpc.ClientConn) map[string]reflect.Value {
	return map[string]reflect.Value{
		"SpecService":       reflect.ValueOf(sidecarv1.NewSpecServiceClient(conn)),
		"RunService":        reflect.ValueOf(sidecarv1.NewRunServiceClient(conn)),
		"ConnectionService": reflect.ValueOf(sidecarv1.NewConnectionServiceClient(conn)),
		"TurnService":       reflect.ValueOf(sidecarv1.NewTurnServiceClient(conn)),
		"ToolService":       reflect.ValueOf(sidecarv1.NewToolServiceClient(conn)),
		"UsageService":      reflect.ValueOf(sidecarv1.NewUsageServiceClient(conn)),
	}
}

// invoker makes a step's call through the generated client method of that
// name: the request type is the method's own, parsed with protojson.
func invoker(clients map[string]reflect.Value) Invoke {
	return func(call string, request map[string]any) (Outcome, error) {
		serviceName, methodName, _ := strings.Cut(call, ".")
		client, ok := clients[serviceName]
		if !ok {
			return Outcome{}, fmt.Errorf("no service %s in the contract", serviceName)
		}
		method := client.MethodByName(methodName)
		if !method.IsValid() {
			return Outcome{}, fmt.Errorf("no method %s in %s", methodName, serviceName)
		}
		message := reflect.New(method.Type().In(1).Elem()).Interface().(proto.Message)
		body, err := json.Marshal(request)
		if err != nil {
			return Outcome{}, err
		}
		if err := protojson.Unmarshal(body, message); err != nil {
			return Outcome{}, fmt.Errorf("request is not a %s: %v", message.ProtoReflect().Descriptor().Name(), err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
		defer cancel()
		results := method.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(message)})
		if callErr, _ := results[1].Interface().(error); callErr != nil {
			return failure(callErr), nil
		}
		printed, err := protojson.Marshal(results[0].Interface().(proto.Message))
		if err != nil {
			return Outcome{}, err
		}
		response, err := DecodeJSON(printed)
		if err != nil {
			return Outcome{}, err
		}
		return Outcome{Response: response.(map[string]any), Code: "OK"}, nil
	}
}

func failure(err error) Outcome {
	st := status.Convert(err)
	outcome := Outcome{Code: codeName(st.Code()), Message: st.Message(), Details: []*ErrorDetail{}}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			outcome.Details = append(outcome.Details, &ErrorDetail{
				Reason: info.GetReason(), Domain: info.GetDomain(), Metadata: info.GetMetadata(),
			})
		} else {
			outcome.Details = append(outcome.Details, nil)
		}
	}
	return outcome
}

func TestScenarios(t *testing.T) {
	files, err := ScenarioFiles(contractDir)
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios in %s/scenarios (%v)", contractDir, err)
	}
	for _, transport := range []string{"unix", "tcp"} {
		passed := 0
		t.Run(transport, func(t *testing.T) {
			s := startSidecar(t, transport)
			clients := generatedClients(s.conn)
			for _, file := range files {
				name := strings.TrimSuffix(filepath.Base(file), ".json")
				t.Run(name, func(t *testing.T) {
					scenario, err := LoadScenario(file)
					if err != nil {
						t.Fatal(err)
					}
					if err := RunScenario(scenario, invoker(clients)); err != nil {
						t.Fatal(err)
					}
					// Reached only when the scenario ran to its end: a skip is not counted.
					passed++
				})
			}
			s.stop(t)
		})
		report(t, transport, passed, len(files))
	}
}

// report prints the count of scenarios that passed over one transport and
// appends it to $PSYCH_CONTRACT_COUNTS for scripts/check-contract-counts.
func report(t *testing.T, transport string, passed, total int) {
	fmt.Printf("contract: go ran %d of %d scenarios over %s\n", passed, total, transport)
	path := os.Getenv(countsEnv)
	if path == "" {
		return
	}
	counts, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer counts.Close()
	if _, err := fmt.Fprintf(counts, "go %s %d\n", transport, passed); err != nil {
		t.Fatal(err)
	}
}

// --- the sidecar process ------------------------------------------------------

// lockedBuffer collects the sidecar's output, written from other goroutines.
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

type sidecar struct {
	cmd    *exec.Cmd
	output *lockedBuffer
	exited chan struct{}
	err    error
	conn   *grpc.ClientConn
}

func freeLoopbackPort(t *testing.T) int {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port
}

// startSidecar runs psych-sidecar serve on one transport with SQLite in a
// temporary directory and waits, bounded, until it reports SERVING.
func startSidecar(t *testing.T, transport string) *sidecar {
	t.Helper()
	bin := os.Getenv("PSYCH_SIDECAR_BIN")
	if bin == "" {
		bin = "psych-sidecar"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Fatalf("sidecar binary %q not found (set PSYCH_SIDECAR_BIN): %v", bin, err)
	}
	// Short: Unix socket paths are limited to ~107 bytes.
	dir, err := os.MkdirTemp("", "pscg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	listen, target := "unix://"+filepath.Join(dir, "s.sock"), "unix://"+filepath.Join(dir, "s.sock")
	if transport == "tcp" {
		listen = fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t))
		target = "passthrough:///" + listen
	}

	s := &sidecar{output: &lockedBuffer{}, exited: make(chan struct{})}
	s.cmd = exec.Command(path, "serve", "--listen", listen,
		"--database-url", "sqlite:///"+filepath.Join(dir, "db.sqlite3"),
		"--data-dir", dir, "--max-message-bytes", fmt.Sprint(maxMessageBytes))
	commands, err := mcpCommands(path)
	if err != nil {
		t.Fatal(err)
	}
	// The OAuth test server of the sign-in scenarios is on loopback, over http.
	s.cmd.Env = append(sidecarEnvironment(), "PSYCH_SIDECAR_MCP_COMMANDS="+commands,
		"PSYCH_SIDECAR_OAUTH_ALLOW_HTTP_LOOPBACK=true")
	s.cmd.Stdout, s.cmd.Stderr = s.output, s.output
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
	s.conn, err = grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { s.conn.Close() })
	s.waitServing(t)
	return s
}

// mcpCommands is PSYCH_SIDECAR_MCP_COMMANDS for the sidecar (README.md, "MCP
// servers"): the project's fixture server over stdio as command `fixture`,
// run by the python beside the sidecar's program, which has `mcp` (the
// sidecar is an MCP client).
func mcpCommands(sidecarPath string) (string, error) {
	python := filepath.Join(filepath.Dir(sidecarPath), "python")
	if _, err := os.Stat(python); err != nil {
		return "", fmt.Errorf("no python beside %s to run the MCP fixture server: %v", sidecarPath, err)
	}
	fixture, err := filepath.Abs(filepath.Join(contractDir, "..", "mcp_servers", "fixture_server.py"))
	if err != nil {
		return "", err
	}
	commands, err := json.Marshal(map[string]any{
		"fixture": map[string]any{
			"argv":             []string{python, fixture, "stdio"},
			"allow_extra_args": true,
			"allowed_env":      []string{"FIXTURE_*"},
		},
	})
	return string(commands), err
}

// sidecarEnvironment keeps PSYCH_SIDECAR_* settings of the caller's
// environment away from the sidecar, so only the runner configures it.
func sidecarEnvironment() []string {
	var env []string
	for _, entry := range os.Environ() {
		if !strings.HasPrefix(entry, "PSYCH_SIDECAR_") {
			env = append(env, entry)
		}
	}
	return env
}

func (s *sidecar) waitServing(t *testing.T) {
	t.Helper()
	health := healthpb.NewHealthClient(s.conn)
	deadline := time.Now().Add(readyTimeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			t.Fatalf("sidecar exited before it was ready: %v\n%s", s.err, s.output.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
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

// stop sends SIGTERM and requires a clean exit within stopTimeout.
func (s *sidecar) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		t.Fatalf("sidecar still running %v after SIGTERM", stopTimeout)
	}
	var exitErr *exec.ExitError
	if s.err != nil && !errors.As(s.err, &exitErr) {
		t.Fatalf("waiting for the sidecar: %v", s.err)
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("sidecar exit status after SIGTERM = %v, want 0", s.cmd.ProcessState)
	}
}
