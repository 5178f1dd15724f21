// Command pod-host is the agent host of scripts/check-pod: it runs in the pod
// deploy/ describes, beside the sidecar, and keeps appending to Runs through
// the socket on the shared volume (PSYCH_SIDECAR_ADDRESS, from deploy/) with
// the Go host client, while the check restarts the sidecar container and
// finally stops the pod. It accounts for every call:
//
//   - each worker appends one user message at a time to its own Run, with a
//     request id of its own, and retries a failed append with the same id
//     until it is acknowledged, so a lost answer never stores twice;
//   - after failures, the first acknowledged append says how long the client
//     took to reconnect;
//   - SIGUSR1: the workers pause between calls and the host reads every Run
//     back (ListRecords): each acknowledged append must be there once, at the
//     sequence its answer gave, and nothing else; then the load resumes;
//   - SIGTERM: no call starts after it; the calls in flight finish, and the
//     host exits 0 only if each was answered (the sidecar drained them).
//
// Every line it prints starts with "pod-host: "; scripts/check-pod reads them.
//
// Environment: PSYCH_SIDECAR_ADDRESS; POD_HOST_WORKERS (Runs and concurrent
// appends, default 4); POD_HOST_PAUSE_MS (each worker's pause between
// appends, default 20: a steady load that leaves the shared machine room).
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sidecarclient "github.com/psych-sidecar/psych-sidecar/clients/go"
	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	tenant      = "pod-check"
	specName    = "pod-check"
	specVersion = 1
	// The socket appears once the sidecar has migrated and loaded its model;
	// podman starts both containers together (no native sidecars), so the
	// host waits for it, bounded, as clients/README.md says a host should.
	socketWait   = 5 * time.Minute
	readyTimeout = 2 * time.Minute
	callTimeout  = 5 * time.Second
	retryPause   = 200 * time.Millisecond
)

func say(format string, args ...any) {
	fmt.Printf("pod-host: "+format+"\n", args...)
}

func main() {
	os.Exit(run())
}

func run() int {
	address := os.Getenv("PSYCH_SIDECAR_ADDRESS")
	workers := envInt("POD_HOST_WORKERS", 4)
	pause := time.Duration(envInt("POD_HOST_PAUSE_MS", 20)) * time.Millisecond
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)

	started := time.Now()
	if err := waitForSocket(address, signals); err != nil {
		say("FAILED: %v", err)
		return 1
	}
	ctx := context.Background()
	client, err := sidecarclient.Dial(ctx, address, sidecarclient.Options{
		ReadyTimeout: readyTimeout,
		CallTimeout:  callTimeout,
	})
	if err != nil {
		say("FAILED: %v", err)
		return 1
	}
	defer client.Close()
	say("SERVING %.1f s after the host started", time.Since(started).Seconds())

	h := &host{client: client, pause: pause, stop: make(chan struct{}), failures: map[string]int{}}
	if err := h.setUp(ctx, workers); err != nil {
		say("FAILED: set-up: %v", err)
		return 1
	}
	var wg sync.WaitGroup
	for _, w := range h.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.load(w)
		}()
	}
	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			say("acknowledged %d appends (%d failed attempts)", h.acknowledged(), h.failed.Load())
		case sig := <-signals:
			if sig == syscall.SIGUSR1 {
				if err := h.verify(ctx); err != nil {
					say("VERIFY FAILED: %v", err)
				}
				continue
			}
			say("%s: no call starts from now on; %d in flight", sig, h.inFlight.Load())
			h.stopping.Store(true)
			close(h.stop)
			wg.Wait()
			return h.summary()
		}
	}
}

func envInt(name string, fallback int) int {
	value, err := strconv.Atoi(os.Getenv(name))
	if err != nil || value < 0 {
		return fallback
	}
	return value
}

// waitForSocket waits until the sidecar's socket exists (CheckAddress finds
// it), or a signal or socketWait ends the wait.
func waitForSocket(address string, signals <-chan os.Signal) error {
	deadline := time.Now().Add(socketWait)
	announced := false
	for {
		err := sidecarclient.CheckAddress(address)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if !announced {
			say("waiting for the sidecar's socket: %v", err)
			announced = true
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no socket after %v: %w", socketWait, err)
		}
		select {
		case sig := <-signals:
			return fmt.Errorf("%s while waiting for the socket", sig)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type worker struct {
	number int
	runID  string
	// acked[i] is the sequence the sidecar gave the i-th append's record.
	acked []int64
	mu    sync.Mutex
}

type host struct {
	client  *sidecarclient.Client
	pause   time.Duration
	workers []*worker
	// gate: workers hold it shared for one call; verify holds it alone.
	gate     sync.RWMutex
	stop     chan struct{}
	stopping atomic.Bool
	inFlight atomic.Int64
	failed   atomic.Int64
	// Calls in flight at SIGTERM, and how they ended.
	drainAnswered atomic.Int64
	drainFailed   atomic.Int64
	mu            sync.Mutex
	failures      map[string]int // failed attempts by gRPC code
}

func (h *host) setUp(ctx context.Context, workers int) error {
	spec := &sidecarv1.Spec{
		Name:         specName,
		Version:      specVersion,
		Instructions: "Appends user messages while scripts/check-pod restarts the sidecar.",
	}
	// Publishing the same content again succeeds: the host may start twice.
	if _, err := h.client.Specs.PublishSpec(ctx, &sidecarv1.PublishSpecRequest{Spec: spec}); err != nil {
		return err
	}
	runs := make([]string, 0, workers)
	for number := range workers {
		created, err := h.client.Runs.CreateRun(ctx, &sidecarv1.CreateRunRequest{
			Tenant: tenant, SpecName: specName, SpecVersion: specVersion,
		})
		if err != nil {
			return err
		}
		h.workers = append(h.workers, &worker{number: number, runID: created.GetRun().GetRunId()})
		runs = append(runs, created.GetRun().GetRunId())
	}
	say("load: %d workers, one Run each (%s), one append at a time each, %v apart",
		workers, strings.Join(runs, " "), h.pause)
	return nil
}

func text(w *worker, index int) string {
	return fmt.Sprintf("w%d-%06d", w.number, index)
}

// load appends to w's Run until SIGTERM, each record until it is acknowledged.
func (h *host) load(w *worker) {
	var failingSince time.Time
	failedInStreak := 0
	for index := 0; ; {
		select {
		case <-h.stop:
			return
		case <-time.After(h.pause):
		}
		h.gate.RLock()
		if h.stopping.Load() {
			h.gate.RUnlock()
			return
		}
		h.inFlight.Add(1)
		response, err := h.client.AppendRecords(context.Background(), &sidecarv1.AppendRecordsRequest{
			RunId:     w.runID,
			RequestId: text(w, index),
			Records: []*sidecarv1.Record{{Kind: &sidecarv1.Record_UserMessage{UserMessage: &sidecarv1.UserMessage{
				Content: []*sidecarv1.ContentPart{{Kind: &sidecarv1.ContentPart_Text{Text: text(w, index)}}},
			}}}},
		})
		h.inFlight.Add(-1)
		draining := h.stopping.Load()
		h.gate.RUnlock()
		if err != nil {
			h.failed.Add(1)
			code := status.Code(err)
			h.mu.Lock()
			h.failures[code.String()]++
			h.mu.Unlock()
			if draining {
				// Started before SIGTERM, failed during the drain.
				h.drainFailed.Add(1)
				say("worker %d: the append in flight at SIGTERM failed: %v", w.number, err)
				return
			}
			if failedInStreak == 0 {
				failingSince = time.Now()
				say("worker %d: append failed (%s), retrying with the same request id", w.number, code)
			}
			failedInStreak++
			time.Sleep(retryPause)
			continue
		}
		w.mu.Lock()
		w.acked = append(w.acked, response.GetRecords()[0].GetSequence())
		w.mu.Unlock()
		if draining {
			h.drainAnswered.Add(1)
			return
		}
		if failedInStreak > 0 {
			say("worker %d: reconnected: an append was acknowledged %.1f s after the first failure (%d failed attempts)",
				w.number, time.Since(failingSince).Seconds(), failedInStreak)
			failedInStreak = 0
		}
		index++
	}
}

func (h *host) acknowledged() int {
	total := 0
	for _, w := range h.workers {
		w.mu.Lock()
		total += len(w.acked)
		w.mu.Unlock()
	}
	return total
}

// verify pauses the load and reads every Run back: its records must be
// exactly the acknowledged appends, in order, each at the sequence its
// answer gave.
func (h *host) verify(ctx context.Context) error {
	h.gate.Lock()
	defer h.gate.Unlock()
	total := 0
	for _, w := range h.workers {
		var texts []string
		var sequences []int64
		token := ""
		for {
			var page *sidecarv1.ListRecordsResponse
			var err error
			// The sidecar may still be coming back: a few tries, bounded.
			for attempt := 1; ; attempt++ {
				page, err = h.client.Runs.ListRecords(ctx, &sidecarv1.ListRecordsRequest{
					RunId: w.runID, PageSize: 1000, PageToken: token,
				})
				if err == nil || attempt == 50 || status.Code(err) != codes.Unavailable {
					break
				}
				time.Sleep(retryPause)
			}
			if err != nil {
				return fmt.Errorf("run %s: ListRecords: %w", w.runID, err)
			}
			for _, record := range page.GetRecords() {
				parts := record.GetUserMessage().GetContent()
				if len(parts) != 1 {
					return fmt.Errorf("run %s: record %d is not one of the host's", w.runID, record.GetSequence())
				}
				texts = append(texts, parts[0].GetText())
				sequences = append(sequences, record.GetSequence())
			}
			token = page.GetNextPageToken()
			if token == "" {
				break
			}
		}
		w.mu.Lock()
		acked := append([]int64(nil), w.acked...)
		w.mu.Unlock()
		if len(texts) != len(acked) {
			return fmt.Errorf("run %s: %d records stored, %d appends acknowledged", w.runID, len(texts), len(acked))
		}
		for index := range acked {
			if texts[index] != text(w, index) || sequences[index] != acked[index] {
				return fmt.Errorf("run %s: record %d is %q at sequence %d; acknowledged %q at sequence %d",
					w.runID, index, texts[index], sequences[index], text(w, index), acked[index])
			}
		}
		total += len(acked)
	}
	say("verified: %d acknowledged appends over %d Runs, each stored once, in order, at its acknowledged sequence",
		total, len(h.workers))
	return nil
}

// summary prints how the drain went and the Runs' acknowledged counts (the
// check compares them with the database), and is the exit status.
func (h *host) summary() int {
	h.mu.Lock()
	codes := make([]string, 0, len(h.failures))
	for code, count := range h.failures {
		codes = append(codes, fmt.Sprintf("%s=%d", code, count))
	}
	h.mu.Unlock()
	sort.Strings(codes)
	runs := make([]string, 0, len(h.workers))
	for _, w := range h.workers {
		runs = append(runs, fmt.Sprintf("%s=%d", w.runID, len(w.acked)))
	}
	if len(codes) == 0 {
		codes = append(codes, "none")
	}
	say("failed attempts by code: %s", strings.Join(codes, " "))
	say("acknowledged per Run: %s", strings.Join(runs, " "))
	say("drain: %d calls in flight at the signal answered, %d failed", h.drainAnswered.Load(), h.drainFailed.Load())
	if h.drainFailed.Load() > 0 {
		return 1
	}
	say("stopped cleanly: %d appends acknowledged", h.acknowledged())
	return 0
}
