"""UsageService: provider-reported usage in, a Run's totals out. Metering code: it must not
reach the token estimator (checked by import-linter)."""

from __future__ import annotations

from psych.sidecar.v1 import usage_service_pb2, usage_service_pb2_grpc
from psych_sidecar.api.plumbing import Blocking, Context
from psych_sidecar.domain.usage import ModelCallUsage, UsageService, UsageTotals


def totals_to_proto(totals: UsageTotals) -> usage_service_pb2.UsageTotals:
    return usage_service_pb2.UsageTotals(
        model_calls=totals.model_calls,
        input_tokens=totals.input_tokens,
        output_tokens=totals.output_tokens,
        cache_read_tokens=totals.cache_read_tokens,
        cache_write_tokens=totals.cache_write_tokens,
        cache_hit_ratio=totals.cache_hit_ratio,
    )


class UsageServicer(usage_service_pb2_grpc.UsageServiceServicer):
    def __init__(self, usage: UsageService, blocking: Blocking) -> None:
        self._usage = usage
        self._blocking = blocking

    async def RecordUsage(
        self, request: usage_service_pb2.RecordUsageRequest, context: Context
    ) -> usage_service_pb2.RecordUsageResponse:
        usage = ModelCallUsage(
            model=request.model,
            input_tokens=request.input_tokens,
            output_tokens=request.output_tokens,
            cache_read_tokens=request.cache_read_tokens,
            cache_write_tokens=request.cache_write_tokens,
        )
        totals = await self._blocking(self._usage.record, request.run_id, request.request_id, usage)
        return usage_service_pb2.RecordUsageResponse(totals=totals_to_proto(totals))

    async def GetRunUsage(
        self, request: usage_service_pb2.GetRunUsageRequest, context: Context
    ) -> usage_service_pb2.GetRunUsageResponse:
        totals = await self._blocking(self._usage.totals, request.run_id)
        return usage_service_pb2.GetRunUsageResponse(totals=totals_to_proto(totals))
