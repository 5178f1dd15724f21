"""The gRPC source of `psych-sidecar inspect`: a running sidecar's read calls (ListRuns,
ListRecords, ListConnections, ListCatalogVersions, DiffCatalog, and AssemblePrompt as a
preview: no journal row, no prompt metrics), their protobuf answers turned into the views'
rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from psych.sidecar.v1 import (
    connection_pb2,
    connection_service_pb2,
    connection_service_pb2_grpc,
    content_pb2,
    run_pb2,
    run_service_pb2,
    run_service_pb2_grpc,
    turn_pb2,
    turn_service_pb2,
    turn_service_pb2_grpc,
)
from psych_sidecar.inspect_command.views import (
    ChangeRow,
    CompactionRow,
    ConnectionRow,
    PromptPreview,
    RecordRow,
    Refused,
    RunRow,
    VersionRow,
    ZoneRow,
    change_rows,
    paged,
)

# Responses may be as large as the sidecar's own limit allows.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]
_KINDS = {
    "user_message": "USER_MESSAGE",
    "assistant_message": "ASSISTANT_MESSAGE",
    "tool_result": "TOOL_RESULT",
    "compaction": "COMPACTION",
}


def content_bytes(parts: Sequence[content_pb2.ContentPart]) -> int:
    """Bytes of content as the log stores it: UTF-8 text, JSON bytes, binary data."""
    total = 0
    for part in parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            total += len(part.text.encode())
        elif kind == "json":
            total += len(part.json)
        elif kind == "binary":
            total += len(part.binary.data)
    return total


def _time(value: timestamp_pb2.Timestamp) -> datetime:
    return value.ToDatetime(tzinfo=UTC)


class GrpcSource:
    live = True

    def __init__(self, target: str, timeout: float) -> None:
        self.where = target
        self._timeout = timeout
        self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._runs = run_service_pb2_grpc.RunServiceStub(self._channel)
        self._turns = turn_service_pb2_grpc.TurnServiceStub(self._channel)
        self._connections = connection_service_pb2_grpc.ConnectionServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout)
        except grpc.RpcError as error:
            raise Refused(f"{error.code().name}: {error.details()}") from error

    def _listing(self, method: Any, request: Callable[[str], Any], items: str) -> Iterator[Any]:
        """The `items` field's entries of every page of a listing: `request(token)` asks for
        a page."""

        def read_page(token: str) -> tuple[Sequence[Any], str]:
            response = self._call(method, request(token))
            return getattr(response, items), response.next_page_token

        return paged(read_page)

    def runs(self, tenant: str, limit: int) -> tuple[list[RunRow], bool]:
        runs: list[run_pb2.Run] = []
        token = ""
        while len(runs) < limit:
            request = run_service_pb2.ListRunsRequest(
                tenant=tenant, page_size=min(limit - len(runs), 1000), page_token=token
            )
            response = self._call(self._runs.ListRuns, request)
            runs.extend(response.runs)
            token = response.next_page_token
            if not token:
                break
        rows = [RunRow(r.run_id, r.spec_name, r.spec_version, _time(r.create_time)) for r in runs]
        return rows, bool(token)

    def _records(
        self, run_id: str, kinds: Sequence[run_pb2.RecordKind.ValueType] = ()
    ) -> Iterator[run_pb2.Record]:
        return self._listing(
            self._runs.ListRecords,
            lambda token: run_service_pb2.ListRecordsRequest(
                run_id=run_id, page_token=token, kinds=kinds
            ),
            "records",
        )

    def records(self, run_id: str) -> list[RecordRow]:
        rows = []
        for record in self._records(run_id):
            kind = record.WhichOneof("kind") or ""
            result = record.tool_result
            tool = kind == "tool_result"
            rows.append(
                RecordRow(
                    record.sequence,
                    _KINDS[kind],
                    result.call_id if tool else "",
                    result.server if tool else "",
                    result.tool if tool else "",
                    result.is_error if tool else False,
                    content_bytes(result.content) if tool else 0,
                    record.handle,
                )
            )
        return rows

    def compactions(self, run_id: str) -> list[CompactionRow]:
        rows = []
        for record in self._records(run_id, [run_pb2.RECORD_KIND_COMPACTION]):
            compaction = record.compaction
            rows.append(
                CompactionRow(
                    record.sequence,
                    _time(record.create_time),
                    compaction.first_sequence,
                    compaction.last_sequence,
                    sum(len(part.text) for part in compaction.summary),
                )
            )
        return rows

    def prompt(self, run_id: str, now: datetime | None) -> PromptPreview:
        request = turn_service_pb2.AssemblePromptRequest(run_id=run_id, preview=True)
        if now is not None:
            request.now.FromDatetime(now)
        answer = self._call(self._turns.AssemblePrompt, request)
        elided = frozenset(
            part.tool_result.handle
            for message in answer.prompt.history
            for part in message.parts
            if part.WhichOneof("kind") == "tool_result" and part.tool_result.elided
        )
        zones = tuple(
            ZoneRow(
                turn_pb2.PromptZone.Name(zone.zone).removeprefix("PROMPT_ZONE_").lower(),
                zone.byte_length,
                zone.sha256,
            )
            for zone in answer.zones
        )
        return PromptPreview(
            zones,
            elided,
            answer.anthropic_request_json,
            answer.openai_request_json,
            answer.openai_responses_request_json,
            answer.gemini_request_json,
        )

    def catalog_versions(self, tenant: str, name: str) -> list[VersionRow]:
        versions = self._listing(
            self._connections.ListCatalogVersions,
            lambda token: connection_service_pb2.ListCatalogVersionsRequest(
                tenant=tenant, name=name, page_token=token
            ),
            "versions",
        )
        return [
            VersionRow(v.catalog_version, v.tool_count, v.sha256, _time(v.create_time))
            for v in versions
        ]

    def catalog_diff(self, tenant: str, name: str, older: int, newer: int) -> list[ChangeRow]:
        diff = self._call(
            self._connections.DiffCatalog,
            connection_service_pb2.DiffCatalogRequest(
                tenant=tenant, name=name, from_version=older, to_version=newer
            ),
        )
        return change_rows(diff)

    def connections(self, tenant: str) -> list[ConnectionRow]:
        connections = self._listing(
            self._connections.ListConnections,
            lambda token: connection_service_pb2.ListConnectionsRequest(
                tenant=tenant, page_token=token
            ),
            "connections",
        )
        return [
            ConnectionRow(
                c.name,
                c.WhichOneof("transport") or "",
                connection_pb2.ConnectionState.Name(c.state).removeprefix("CONNECTION_STATE_"),
                _time(c.state_time) if c.HasField("state_time") else None,
                c.catalog_version,
                c.last_error,
            )
            for c in connections
        ]
