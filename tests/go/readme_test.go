package polyglot_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadmeSnippet builds the README's Go snippet (readme/main.go) and runs
// it, as a newcomer would, beside a sidecar started on scripts/serve's
// defaults (psych-sidecar-data/sidecar.sock under the working directory), with
// PSYCH_SIDECAR_ADDRESS naming that socket. The snippet waits for SERVING itself.
func TestReadmeSnippet(t *testing.T) {
	bin := os.Getenv("PSYCH_SIDECAR_BIN")
	if bin == "" {
		bin = "psych-sidecar"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Fatalf("sidecar binary %q not found (set PSYCH_SIDECAR_BIN): %v", bin, err)
	}
	dir, err := os.MkdirTemp("", "psreadme")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	program := filepath.Join(dir, "readme")
	build := exec.Command("go", "build", "-o", program, "./readme")
	if output, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./readme: %v\n%s", err, output)
	}

	output := &lockedBuffer{}
	serve := exec.Command(path, "serve")
	serve.Dir = dir
	serve.Env = withoutSidecarSettings(os.Environ())
	serve.Stdout, serve.Stderr = output, output
	if err := serve.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	defer func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(exitTimeout):
			_ = serve.Process.Kill()
		}
		if t.Failed() {
			t.Logf("sidecar output:\n%s", output.String())
		}
	}()

	run := exec.Command(program)
	run.Dir = dir
	run.Env = append(os.Environ(), "PSYCH_SIDECAR_ADDRESS=unix:"+filepath.Join(dir, "psych-sidecar-data", "sidecar.sock"))
	got, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("the README's Go snippet failed: %v\n%s", err, got)
	}
	for _, want := range []string{"appended at sequence 1\n", "NotFound RUN_NOT_FOUND run_missing\n"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("the README's Go snippet printed %q, want a line %q", got, want)
		}
	}
}

func withoutSidecarSettings(environ []string) []string {
	kept := environ[:0:0]
	for _, variable := range environ {
		if !strings.HasPrefix(variable, "PSYCH_SIDECAR_") || strings.HasPrefix(variable, "PSYCH_SIDECAR_BIN=") {
			kept = append(kept, variable)
		}
	}
	return kept
}
