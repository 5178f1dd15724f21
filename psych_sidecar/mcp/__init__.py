"""The MCP client layer: one owned session per connection, the catalogue's refresh triggers,
and tool execution. It implements the catalogue's ports (`CatalogView`, `ToolRunner`,
`ConnectionSupervisor`, exported by `psych_sidecar.domain.catalog`), each by a class of its own
over one `SessionRegistry` (docs/design.md, "MCP layer")."""
