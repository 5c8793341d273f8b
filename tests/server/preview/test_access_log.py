"""The signatures of signed port URLs never reach the server's logs: a real uvicorn server,
configured as `pandastack serve` configures it, logs plain and WebSocket requests to signed
URLs with the signature REDACTED."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from pandastack.server.preview.signing import REDACTED, SignatureRedactor, redact_signatures
from tests.server.live import fake_server


def test_redaction_of_signature_parameters() -> None:
    assert redact_signatures('"GET /p/?ps_expires=9&ps_sig=abc&x=1 HTTP/1.1" 200') \
        == f'"GET /p/?ps_expires=9&ps_sig={REDACTED}&x=1 HTTP/1.1" 200'
    # The server decodes parameter names, so an encoded name is a signature too.
    assert redact_signatures("/p/?ps%5Fsig=abc") == f"/p/?ps%5Fsig={REDACTED}"
    assert redact_signatures("/p/?keep=ps_sig=abc&ps_sigx=1") == "/p/?keep=ps_sig=abc&ps_sigx=1"
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s"', ("1.2.3.4", "GET", "/p?ps_sig=abc"), None)
    assert SignatureRedactor().filter(record)
    assert record.getMessage() == f'1.2.3.4 - "GET /p?ps_sig={REDACTED}"'
    # httpx logs the port proxy's upstream requests with URL objects.
    url = httpx.URL("http://10.0.0.2:8000/x?ps%5Fsig=abc")
    record = logging.LogRecord("httpx", logging.INFO, __file__, 1, "HTTP Request: %s %s %d",
                               ("GET", url, 200), None)
    assert SignatureRedactor().filter(record)
    assert record.getMessage() == \
        f"HTTP Request: GET http://10.0.0.2:8000/x?ps%5Fsig={REDACTED} 200"


@pytest.mark.timeout(120)
def test_signed_url_signatures_stay_out_of_the_access_log(tmp_path: Path) -> None:
    with fake_server(tmp_path, module="tests.server.serve_logged") as server, \
            httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as api:
        r = api.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        r = api.post(f"/v1/sandboxes/{sid}/ports/8000/signed-url", json={"ttl_seconds": 60})
        assert r.status_code == 200, r.text
        parts = urlsplit(r.json()["url"])
        signature = dict(p.split("=") for p in parts.query.split("&"))["ps_sig"]
        preview = f"http://127.0.0.1:{server.preview_port}"
        host = {"Host": f"{parts.hostname}:{parts.port}"}
        for query in (parts.query, parts.query.replace("ps_sig", "ps%5Fsig")):
            r = httpx.get(f"{preview}/x?{query}", headers=host, timeout=30)
            assert r.status_code != 403, r.text  # the signature was accepted
        with pytest.raises(InvalidStatus):
            sock = socket.create_connection(("127.0.0.1", server.preview_port), timeout=30)
            connect(f"ws://{parts.hostname}:{parts.port}/ws?{parts.query}", sock=sock,
                    open_timeout=30).close()
    # Read once the server has stopped: everything it logged is in the file.
    text = server.log.read_text(errors="replace")
    assert "/x?" in text and "/ws?" in text, text[-3000:]
    assert signature not in text, text[-3000:]
    assert text.count(f"ps_sig={REDACTED}") >= 2 and f"ps%5Fsig={REDACTED}" in text
