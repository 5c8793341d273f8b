"""The host API: the routes the `pandastack agent` process serves over its host port, their
streamed responses, auth and errors. Its client is `pandastack.server.hostclient`; what both
share is `pandastack.hostport.host_api` (the operation table, models, codec) and
`pandastack.hostport.frames`."""

from .app import create_host_app

__all__ = ["create_host_app"]
