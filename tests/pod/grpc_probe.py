"""The kubelet's gRPC probes, for scripts/check-pod (podman's kube play runs none of them).

Run inside the pod's network namespace (nsenter), against the probe's port on the pod's
address, with the kubelet's rules: a probe passes when grpc.health.v1 Check answers SERVING
within timeoutSeconds; periodSeconds apart; failureThreshold failures in a row fail it.

    grpc_probe.py startup PORT PERIOD FAILURE_THRESHOLD TIMEOUT
        exit 0 once a probe passes (printing how long it took), 1 after the threshold
    grpc_probe.py once PORT TIMEOUT
        one probe: prints the status (or the gRPC error code), exit 0 if SERVING
    grpc_probe.py watch PORT SECONDS
        a probe every 0.2 s for SECONDS (or until the port refuses): prints each change of
        answer with the time of day, as the readiness probe would see a drain
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ADDRESS = "127.0.0.1"


def probe(port: int, timeout: float) -> str:
    with grpc.insecure_channel(f"{ADDRESS}:{port}") as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        except grpc.RpcError as error:
            return str(error.code().name)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def startup(port: int, period: float, threshold: int, timeout: float) -> int:
    start = time.monotonic()
    answer = ""
    for attempt in range(1, threshold + 1):
        began = time.monotonic()
        answer = probe(port, timeout)
        if answer == "SERVING":
            print(f"startup probe passed: attempt {attempt}, {time.monotonic() - start:.1f} s")
            return 0
        time.sleep(max(0.0, period - (time.monotonic() - began)))
    print(f"startup probe failed {threshold} times in a row (last answer {answer})")
    return 1


def watch(port: int, seconds: float) -> int:
    start = time.monotonic()
    last = ""
    while time.monotonic() - start < seconds:
        answer = probe(port, 0.5)
        if answer != last:
            now = datetime.now(UTC)
            print(f"{now:%H:%M:%S}.{now.microsecond // 1000:03d}  {answer}", flush=True)
            last = answer
        if answer == "UNAVAILABLE":
            break
        time.sleep(0.2)
    return 0


def main(argv: list[str]) -> int:
    mode, port = argv[0], int(argv[1])
    if mode == "startup":
        return startup(port, float(argv[2]), int(argv[3]), float(argv[4]))
    if mode == "once":
        answer = probe(port, float(argv[2]))
        print(answer)
        return 0 if answer == "SERVING" else 1
    if mode == "watch":
        return watch(port, float(argv[2]))
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
