"""Builders for requests the tests send again and again."""

from __future__ import annotations

from psych.sidecar.v1 import content_pb2, run_pb2, run_service_pb2, spec_pb2, spec_service_pb2
from tests.support.sidecar import Stubs


def text_part(value: str) -> content_pb2.ContentPart:
    return content_pb2.ContentPart(text=value)


def user(value: str) -> run_pb2.Record:
    return run_pb2.Record(user_message=run_pb2.UserMessage(content=[text_part(value)]))


def tool_result(
    call_id: str, *parts: content_pb2.ContentPart, is_error: bool = False
) -> run_pb2.Record:
    return run_pb2.Record(
        tool_result=run_pb2.ToolResult(call_id=call_id, is_error=is_error, content=list(parts))
    )


def publish(stubs: Stubs, name: str, version: int = 1, **fields: object) -> spec_pb2.Spec:
    spec = spec_pb2.Spec(name=name, version=version, **fields)  # type: ignore[arg-type]
    return stubs.specs.PublishSpec(spec_service_pb2.PublishSpecRequest(spec=spec)).spec


def new_run(stubs: Stubs, spec_name: str, tenant: str = "tenant-a") -> str:
    publish(stubs, spec_name)
    request = run_service_pb2.CreateRunRequest(tenant=tenant, spec_name=spec_name, spec_version=1)
    return stubs.runs.CreateRun(request).run.run_id


def all_records(stubs: Stubs, run_id: str, page_size: int = 0) -> list[run_pb2.Record]:
    records: list[run_pb2.Record] = []
    token = ""
    while True:
        page = stubs.runs.ListRecords(
            run_service_pb2.ListRecordsRequest(run_id=run_id, page_size=page_size, page_token=token)
        )
        records.extend(page.records)
        token = page.next_page_token
        if not token:
            return records
