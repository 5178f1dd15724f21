package polyglot_test

import (
	"context"
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
// PSYCH_SIDECAR_ADDRESS naming that socket, once the socket is there (as a newcomer runs
// it once scripts/serve says SERVING). The snippet waits for SERVING itself.
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

	socket := filepath.Join(dir, "psych-sidecar-data", "sidecar.sock")
	for deadline := time.Now().Add(exitTimeout); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil || time.Now().After(deadline) {
			break
		}
	}
	run := exec.Command(program)
	run.Dir = dir
	run.Env = append(os.Environ(), "PSYCH_SIDECAR_ADDRESS=unix:"+socket)
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

// TestReadmeSnippetNamesAMissingSocketAtOnce: a wrong socket path (here a
// relative one, from another directory) fails at once, naming it. Before: 20 s
// of retries, then "not SERVING: context deadline exceeded".
func TestReadmeSnippetNamesAMissingSocketAtOnce(t *testing.T) {
	dir := t.TempDir()
	program := filepath.Join(dir, "readme")
	build := exec.Command("go", "build", "-o", program, "./readme")
	if output, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./readme: %v\n%s", err, output)
	}
	for _, address := range []string{"unix:psych-sidecar-data/sidecar.sock", "unix://" + filepath.Join(dir, "nobody.sock")} {
		ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
		run := exec.CommandContext(ctx, program)
		run.Dir = dir
		run.Env = append(withoutSidecarSettings(os.Environ()), "PSYCH_SIDECAR_ADDRESS="+address)
		got, err := run.CombinedOutput()
		cancel()
		socket := strings.TrimPrefix(strings.TrimPrefix(address, "unix:"), "//")
		want := "no socket at " + socket + " (PSYCH_SIDECAR_ADDRESS=" + address + "): is scripts/serve running?"
		if err == nil || !strings.Contains(string(got), want) {
			t.Errorf("with %s the snippet said %q (%v), want %q", address, got, err, want)
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
