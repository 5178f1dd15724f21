"""What more than one test module uses: the sidecar in-process and as a `serve` process,
polling, databases, request builders, MCP connections and prompt checks. Test modules import
from here, never from each other."""
