"""SpecService: publish and read agent specs."""

from __future__ import annotations

from psych.sidecar.v1 import spec_service_pb2, spec_service_pb2_grpc
from psych_sidecar.api import convert
from psych_sidecar.api.plumbing import Blocking, Context
from psych_sidecar.domain.errors import field_required
from psych_sidecar.domain.runlog import SpecService


class SpecServicer(spec_service_pb2_grpc.SpecServiceServicer):
    def __init__(self, specs: SpecService, blocking: Blocking) -> None:
        self._specs = specs
        self._blocking = blocking

    async def PublishSpec(
        self, request: spec_service_pb2.PublishSpecRequest, context: Context
    ) -> spec_service_pb2.PublishSpecResponse:
        if not request.HasField("spec"):
            raise field_required("spec")
        published = await self._blocking(self._specs.publish, convert.spec_from_proto(request.spec))
        return spec_service_pb2.PublishSpecResponse(spec=convert.spec_to_proto(published))

    async def GetSpec(
        self, request: spec_service_pb2.GetSpecRequest, context: Context
    ) -> spec_service_pb2.GetSpecResponse:
        published = await self._blocking(self._specs.get, request.name, request.version)
        return spec_service_pb2.GetSpecResponse(spec=convert.spec_to_proto(published))
