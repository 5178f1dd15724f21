"""What more than one test module uses: the sidecar in-process and as a `serve` process,
polling, databases, request builders, MCP connections, signing in to an OAuth-protected server,
a hostile authorization server and prompt checks. Test modules import from here, never from
each other (test_layout checks)."""
