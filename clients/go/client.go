// Package sidecarclient is a thin Go host client for psych-sidecar, beside
// the generated stubs (which stay the contract).
//
//	client, err := sidecarclient.Dial(ctx, "unix:///run/psych/sidecar.sock", sidecarclient.Options{})
//	run, err := client.Runs.CreateRun(ctx, &sidecarv1.CreateRunRequest{...})
//	appended, err := client.AppendRecords(ctx, &sidecarv1.AppendRecordsRequest{...})
//	switch sidecarclient.ReasonOf(err) {
//	case sidecarv1.ErrorReason_ERROR_REASON_RUN_NOT_FOUND: ...
//	}
//
// Dial waits, bounded, for grpc.health.v1 to report SERVING. Every call made
// through the client's stubs gets a deadline when its context has none, and
// fails with an *Error carrying the sidecar's ErrorInfo as a generated
// ErrorReason. AppendRecords retries on UNAVAILABLE or DEADLINE_EXCEEDED with
// the same request id, so a lost response never stores twice.
package sidecarclient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// Defaults for the zero values of Options.
const (
	DefaultReadyTimeout   = 20 * time.Second
	DefaultCallTimeout    = 10 * time.Second
	DefaultAppendAttempts = 3
	// The sidecar's own default limit: prompts and tool results outgrow
	// gRPC's 4 MiB default.
	DefaultMaxMessageBytes = 64 << 20
)

const (
	errorDomain  = "psych.sidecar.v1"
	reasonPrefix = "ERROR_REASON_"
	retryBackoff = 100 * time.Millisecond
)

// Options configures Dial; zero values take the defaults above.
type Options struct {
	// ReadyTimeout bounds Dial's wait for SERVING.
	ReadyTimeout time.Duration
	// CallTimeout is the deadline of a call whose context has none.
	CallTimeout time.Duration
	// AppendAttempts is how many times AppendRecords tries in all.
	AppendAttempts int
	// MaxMessageBytes is the largest message sent or received.
	MaxMessageBytes int
	// DialOptions are added to the client's own, e.g. interceptors.
	DialOptions []grpc.DialOption
}

// Client holds one connection and the generated client of every service.
type Client struct {
	Conn        *grpc.ClientConn
	Specs       sidecarv1.SpecServiceClient
	Runs        sidecarv1.RunServiceClient
	Connections sidecarv1.ConnectionServiceClient
	Turns       sidecarv1.TurnServiceClient
	Tools       sidecarv1.ToolServiceClient
	Usage       sidecarv1.UsageServiceClient
	options     Options
}

// Dial connects to address — "unix:///absolute.sock", "unix:relative.sock"
// or "host:port", as the sidecar's --listen takes them — and waits until it
// reports SERVING, for at most ReadyTimeout. Before it waits, CheckAddress
// says at once what is wrong with the address: a Unix socket that is not
// there, or a socket path written without "unix:".
func Dial(ctx context.Context, address string, options Options) (*Client, error) {
	if err := CheckAddress(address); err != nil {
		return nil, err
	}
	if options.ReadyTimeout == 0 {
		options.ReadyTimeout = DefaultReadyTimeout
	}
	if options.CallTimeout == 0 {
		options.CallTimeout = DefaultCallTimeout
	}
	if options.AppendAttempts == 0 {
		options.AppendAttempts = DefaultAppendAttempts
	}
	if options.MaxMessageBytes == 0 {
		options.MaxMessageBytes = DefaultMaxMessageBytes
	}
	c := &Client{options: options}
	dialOptions := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(options.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(options.MaxMessageBytes),
		),
		grpc.WithChainUnaryInterceptor(c.deadlineAndError),
	}, options.DialOptions...)
	conn, err := grpc.NewClient(address, dialOptions...)
	if err != nil {
		return nil, err
	}
	c.Conn = conn
	c.Specs = sidecarv1.NewSpecServiceClient(conn)
	c.Runs = sidecarv1.NewRunServiceClient(conn)
	c.Connections = sidecarv1.NewConnectionServiceClient(conn)
	c.Turns = sidecarv1.NewTurnServiceClient(conn)
	c.Tools = sidecarv1.NewToolServiceClient(conn)
	c.Usage = sidecarv1.NewUsageServiceClient(conn)
	if err := c.waitServing(ctx, address); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// CheckAddress returns what is wrong with address, at once: a "unix:" socket
// that is not there (errors.Is(err, fs.ErrNotExist) holds) or is not a
// socket, or a socket path written without "unix:". A TCP address is only
// tried, by Dial.
func CheckAddress(address string) error {
	if address == "" {
		return errors.New("no sidecar address: give the one scripts/serve prints (unix:/…/psych-sidecar-data/sidecar.sock)")
	}
	rest, isUnix := strings.CutPrefix(address, "unix:")
	if !isUnix {
		if !strings.Contains(address, "://") && (strings.HasPrefix(address, "/") ||
			strings.HasPrefix(address, ".") || strings.HasPrefix(address, "~") ||
			strings.HasSuffix(address, ".sock") ||
			(strings.Contains(address, "/") && !strings.Contains(address, ":"))) {
			return fmt.Errorf("%s is a socket path without unix: in front: write unix:%s", address, address)
		}
		return nil
	}
	path, err := filepath.Abs(strings.TrimPrefix(rest, "//"))
	if err != nil {
		return err
	}
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		why := "is the sidecar running, and listening there?"
		if dir, statErr := os.Stat(filepath.Dir(path)); statErr != nil || !dir.IsDir() {
			why = fmt.Sprintf("the directory %s does not exist", filepath.Dir(path))
		}
		return missingSocket(fmt.Sprintf("no socket at %s (from %s): %s", path, address, why))
	}
	if err != nil {
		return err
	}
	if info.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s (from %s) is not a socket", path, address)
	}
	return nil
}

// missingSocket is CheckAddress's error for a socket that is not there.
type missingSocket string

func (m missingSocket) Error() string { return string(m) }

func (m missingSocket) Is(target error) bool { return target == fs.ErrNotExist }

// Close closes the connection.
func (c *Client) Close() error { return c.Conn.Close() }

func (c *Client) waitServing(ctx context.Context, address string) error {
	ctx, cancel := context.WithTimeout(ctx, c.options.ReadyTimeout)
	defer cancel()
	health := healthpb.NewHealthClient(c.Conn)
	last := "no answer"
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, time.Second)
		resp, err := health.Check(attempt, &healthpb.HealthCheckRequest{})
		cancelAttempt()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err != nil {
			last = status.Code(err).String()
		} else {
			last = resp.GetStatus().String()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("psych-sidecar at %s not SERVING within %v (%s): %w",
				address, c.options.ReadyTimeout, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// deadlineAndError gives a call without a deadline the CallTimeout, and
// turns its failure into an *Error.
func (c *Client) deadlineAndError(ctx context.Context, method string, req, reply any,
	conn *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.options.CallTimeout)
		defer cancel()
	}
	if err := invoker(ctx, method, req, reply, conn, opts...); err != nil {
		return newError(err)
	}
	return nil
}

// AppendRecords appends with Runs.AppendRecords and retries, up to
// AppendAttempts in all, on UNAVAILABLE or DEADLINE_EXCEEDED with the same
// request id (a random one when the request has none; the request itself is
// left unchanged). The sidecar stores the records once and answers every
// attempt with the first answer. Each attempt gets CallTimeout unless ctx has
// a deadline, which then bounds all attempts.
func (c *Client) AppendRecords(ctx context.Context, req *sidecarv1.AppendRecordsRequest) (*sidecarv1.AppendRecordsResponse, error) {
	if req.GetRequestId() == "" {
		id := make([]byte, 16)
		if _, err := rand.Read(id); err != nil {
			return nil, err
		}
		req = proto.Clone(req).(*sidecarv1.AppendRecordsRequest)
		req.RequestId = hex.EncodeToString(id)
	}
	backoff := retryBackoff
	for attempt := 1; ; attempt++ {
		resp, err := c.Runs.AppendRecords(ctx, req)
		if err == nil {
			return resp, nil
		}
		code := status.Code(err)
		if (code != codes.Unavailable && code != codes.DeadlineExceeded) ||
			attempt >= c.options.AppendAttempts || ctx.Err() != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
		backoff *= 2
	}
}

// Error is a failed call. Switch on Reason, a generated ErrorReason value:
// ERROR_REASON_UNSPECIFIED when the failure carries no ErrorInfo (gRPC's own
// failures: UNAVAILABLE, DEADLINE_EXCEEDED, ...) or a reason newer than this
// client's stubs (ReasonName still holds it).
type Error struct {
	Code       codes.Code
	Message    string
	Reason     sidecarv1.ErrorReason
	ReasonName string
	Metadata   map[string]string
	status     *status.Status
}

func newError(err error) *Error {
	st := status.Convert(err)
	e := &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, status: st}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok && info.GetDomain() == errorDomain {
			e.ReasonName = info.GetReason()
			e.Reason = sidecarv1.ErrorReason(sidecarv1.ErrorReason_value[reasonPrefix+info.GetReason()])
			for key, value := range info.GetMetadata() {
				e.Metadata[key] = value
			}
			break
		}
	}
	return e
}

func (e *Error) Error() string {
	if e.ReasonName == "" {
		return fmt.Sprintf("psych-sidecar: %s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("psych-sidecar: %s: %s (%s)", e.Code, e.Message, e.ReasonName)
}

// GRPCStatus lets status.Code, status.FromError and status.Convert read it.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// AsError returns err's *Error, if it is one (or wraps one).
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// ReasonOf returns err's ErrorReason, ERROR_REASON_UNSPECIFIED when it has none.
func ReasonOf(err error) sidecarv1.ErrorReason {
	if e, ok := AsError(err); ok {
		return e.Reason
	}
	return sidecarv1.ErrorReason_ERROR_REASON_UNSPECIFIED
}
