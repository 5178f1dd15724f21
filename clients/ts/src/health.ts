// grpc.health.v1, described in place: no npm package ships it for protobuf-es v2
// and the contract does not include it; its shape is stable.

import { type Message, create, createFileRegistry } from "@bufbuild/protobuf";
import type { GenMessage, GenService } from "@bufbuild/protobuf/codegenv2";
import { FieldDescriptorProto_Type, FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";

type HealthCheckRequest = Message<"grpc.health.v1.HealthCheckRequest"> & { service: string };
type HealthCheckResponse = Message<"grpc.health.v1.HealthCheckResponse"> & { status: number };

export const SERVING = 1;

const registry = createFileRegistry(
  create(FileDescriptorProtoSchema, {
    name: "grpc/health/v1/health.proto",
    package: "grpc.health.v1",
    syntax: "proto3",
    messageType: [
      {
        name: "HealthCheckRequest",
        field: [{ name: "service", number: 1, type: FieldDescriptorProto_Type.STRING, jsonName: "service" }],
      },
      {
        name: "HealthCheckResponse",
        field: [
          {
            name: "status",
            number: 1,
            type: FieldDescriptorProto_Type.ENUM,
            typeName: ".grpc.health.v1.HealthCheckResponse.ServingStatus",
            jsonName: "status",
          },
        ],
        enumType: [
          {
            name: "ServingStatus",
            value: [
              { name: "UNKNOWN", number: 0 },
              { name: "SERVING", number: 1 },
              { name: "NOT_SERVING", number: 2 },
              { name: "SERVICE_UNKNOWN", number: 3 },
            ],
          },
        ],
      },
    ],
    service: [
      {
        name: "Health",
        method: [
          {
            name: "Check",
            inputType: ".grpc.health.v1.HealthCheckRequest",
            outputType: ".grpc.health.v1.HealthCheckResponse",
          },
        ],
      },
    ],
  }),
  () => undefined,
);

export const Health = registry.getService("grpc.health.v1.Health") as unknown as GenService<{
  check: { methodKind: "unary"; input: GenMessage<HealthCheckRequest>; output: GenMessage<HealthCheckResponse> };
}>;
