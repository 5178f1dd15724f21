"""The MCP client layer: one owned session per connection, the catalogue's refresh triggers,
and tool execution. It implements the seam in `psych_sidecar.domain.connections`."""
