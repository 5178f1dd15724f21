"""The domain core: what a Spec, a Run and its log are, and the rules over them.

Nothing here imports gRPC, generated protobuf code or SQL; the API layer translates
protobuf to these types and storage persists them.
"""
