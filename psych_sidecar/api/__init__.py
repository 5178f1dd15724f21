"""The gRPC face: servicers translate protobuf to domain calls and domain errors to statuses."""
