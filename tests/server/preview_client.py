"""A client of an in-process app's preview listener (server/preview/listener.py): `serve` dispatches
by the port a request came in on, and httpx's ASGITransport puts the URL's host and port in
`scope["server"]`, so a base URL of `http://{host}:{preview port}` is the preview origin of
`host` with no socket and no DNS."""

from __future__ import annotations

import httpx

from pandastack.server.preview.listener import PreviewDispatch
from tests.server.conftest import Api


def preview_client(api: Api, host: str) -> httpx.AsyncClient:
    settings = api.app.state.settings
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(PreviewDispatch(api.app, settings),
                                      raise_app_exceptions=False),
        base_url=f"http://{host}:{settings.preview_listener_port}", timeout=30)
