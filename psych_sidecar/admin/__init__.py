"""The admin HTTP listener: /metrics and whatever other modules mount beside it.

Off by default (`admin_listen`). An ASGI app (Starlette) served by uvicorn inside the
sidecar's own event loop, started and stopped with the sidecar. Routes come from a list the
sidecar assembles (`app.sidecar.Sidecar._admin_routes`); a module that serves something here
exposes an `admin_routes(...)` function returning Starlette routes.
"""

from psych_sidecar.admin._server import AdminServer

__all__ = ["AdminServer"]
