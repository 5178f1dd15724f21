// The README's Go snippet, verbatim from "README begin" to "README end"
// (tests/test_readme.py checks they agree); TestReadmeSnippet runs it against a
// sidecar on scripts/serve's defaults, and scripts/test-examples from a scratch
// module outside the clone, made as the README says.

// README begin
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	sidecarv1 "github.com/psych-sidecar/psych-sidecar/generated/go/psych/sidecar/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func main() {
	// The address scripts/serve printed ("serve: SERVING on unix:/…/sidecar.sock").
	address := os.Getenv("PSYCH_SIDECAR_ADDRESS")
	socket, isUnix := strings.CutPrefix(address, "unix:")
	if !isUnix {
		log.Fatal("set PSYCH_SIDECAR_ADDRESS to the address scripts/serve printed (unix:/…/sidecar.sock)")
	}
	// No socket there: say so now, not after 20 s of retries.
	socket = strings.TrimPrefix(socket, "//")
	if info, err := os.Stat(socket); err != nil || info.Mode()&os.ModeSocket == 0 {
		log.Fatalf("no socket at %s (PSYCH_SIDECAR_ADDRESS=%s): is scripts/serve running?", socket, address)
	}
	conn, err := grpc.NewClient(address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Ready when health says SERVING.
	health := healthpb.NewHealthClient(conn)
	for {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if ctx.Err() != nil {
			log.Fatalf("sidecar at %s not SERVING: %v", address, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	specs := sidecarv1.NewSpecServiceClient(conn)
	runs := sidecarv1.NewRunServiceClient(conn)

	// Once per agent version. Versions are immutable; bad thresholds are refused here.
	if _, err := specs.PublishSpec(ctx, &sidecarv1.PublishSpecRequest{Spec: &sidecarv1.Spec{
		Name: "support-agent", Version: 1, Instructions: "You help customers.",
		Thresholds: &sidecarv1.Thresholds{PerResultTokens: proto.Int64(4000), PerBatchTokens: proto.Int64(16000)},
		Grants:     []*sidecarv1.ToolGrant{{ServerPattern: "*", ToolPattern: "*"}},
	}}); err != nil {
		log.Fatal(err)
	}
	created, err := runs.CreateRun(ctx, &sidecarv1.CreateRunRequest{
		Tenant: "acme", SpecName: "support-agent", SpecVersion: 1})
	if err != nil {
		log.Fatal(err)
	}
	runID := created.GetRun().GetRunId()

	// A request id makes a retried append (after a lost response) store once.
	appended, err := runs.AppendRecords(ctx, &sidecarv1.AppendRecordsRequest{
		RunId: runID, RequestId: "turn-1-user",
		Records: []*sidecarv1.Record{{Kind: &sidecarv1.Record_UserMessage{UserMessage: &sidecarv1.UserMessage{
			Content: []*sidecarv1.ContentPart{{Kind: &sidecarv1.ContentPart_Text{Text: "Where is my order?"}}},
		}}}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("appended at sequence", appended.GetRecords()[0].GetSequence()) // 1

	// Every error carries one google.rpc.ErrorInfo: switch on its reason (docs/errors.md).
	_, err = runs.GetRun(ctx, &sidecarv1.GetRunRequest{RunId: "run_missing"})
	if info := errorInfo(err); info != nil && info.GetReason() == "RUN_NOT_FOUND" {
		fmt.Println(status.Code(err), info.GetReason(), info.GetMetadata()["run_id"]) // NotFound RUN_NOT_FOUND run_missing
	}
}

func errorInfo(err error) *errdetails.ErrorInfo {
	for _, detail := range status.Convert(err).Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// README end
