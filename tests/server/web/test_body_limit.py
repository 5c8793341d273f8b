"""Huge request bodies are refused with a 413 envelope without being read into memory: 1 GB
sent to JSON endpoints of a real uvicorn server (in a process of its own, over the in-memory
runtime), chunked and with a Content-Length, while the server's peak RSS is watched."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime
from tests.server.live import fake_server

GB = 1 << 30
CHUNK = b"x" * (1 << 20)
MAX_GROWTH_KB = 50 << 10


def proc_status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def peak_growth_kb(pid: int, baseline_kb: int) -> int:
    """How far the peak RSS (VmHWM, reset by `reset_peak`) rose over `baseline_kb`."""
    return proc_status_kb(pid, "VmHWM") - baseline_kb


def reset_peak(pid: int) -> int:
    """Reset the process's peak RSS to its current RSS (as root); returns that RSS in KiB."""
    # without it the peak may include start-up: the check only gets looser
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    return proc_status_kb(pid, "VmRSS")


def one_gb() -> Iterator[bytes]:
    for _ in range(GB // len(CHUNK)):
        yield CHUNK


def test_one_gigabyte_json_body_is_refused_without_reading_it(tmp_path: Path) -> None:
    with fake_server(tmp_path) as srv, httpx.Client(base_url=srv.url, headers=srv.headers(),
                                                      timeout=60) as c:
        r = c.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "true"}).raise_for_status()
        baseline = reset_peak(srv.pid)
        started = time.monotonic()
        cases = [
            ("/v1/sandboxes", {}),  # chunked: counted while streaming
            (f"/v1/sandboxes/{sid}/exec", {}),
            ("/v1/sandboxes", {"Content-Length": str(GB)}),  # refused before reading
            (f"/v1/sandboxes/{sid}/exec", {"Content-Length": str(GB)}),
        ]
        for url, extra in cases:
            headers = {"Content-Type": "application/json", **extra}
            # a fresh connection each time: the server closes it after a 413
            with httpx.Client(base_url=srv.url, headers=srv.headers(), timeout=60) as one:
                r = one.post(url, content=one_gb(), headers=headers)
            assert_envelope(r, 413, "payload_too_large")
            assert r.headers.get("connection") == "close"
        elapsed = time.monotonic() - started
        growth = peak_growth_kb(srv.pid, baseline)
        assert growth < MAX_GROWTH_KB, (baseline, growth, srv.log_tail())
        assert elapsed < 30, elapsed
        # the server is fine afterwards, and the sandbox too
        r = c.post(f"/v1/sandboxes/{sid}/exec", json={"cmd": "echo ok"})
        assert r.status_code == 200, r.text
        assert "Traceback" not in srv.log_tail(100_000)


async def test_body_limits_in_process(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_body_bytes=1000, max_upload_bytes=5000)
    async with running_app(settings, FakeRuntime(tmp_path)) as api:
        c = api.client
        sid = (await c.post("/v1/sandboxes", json={})).json()["id"]
        ok = {"cmd": "x" * 900}
        assert (await c.post(f"/v1/sandboxes/{sid}/exec", json=ok)).status_code == 200
        big = {"cmd": "x" * 1000}
        r = await c.post(f"/v1/sandboxes/{sid}/exec", json=big)
        assert_envelope(r, 413, "payload_too_large")
        # an unauthenticated huge body is refused as too large, before auth is looked at
        r = await c.post("/v1/sandboxes", json=big, headers={"Authorization": ""})
        assert_envelope(r, 413, "payload_too_large")

        async def chunks(n: int) -> AsyncIterator[bytes]:
            yield b'{"cmd": "'
            for _ in range(n):
                yield b"y" * 100
            yield b'"}'

        r = await c.post(f"/v1/sandboxes/{sid}/exec", content=chunks(20),
                         headers={"content-type": "application/json"})
        assert_envelope(r, 413, "payload_too_large")
        assert r.headers["connection"] == "close"
        r = await c.post(f"/v1/sandboxes/{sid}/exec", content=chunks(5),
                         headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        # raw uploads keep their own, larger limit
        url = f"/v1/sandboxes/{sid}/files"
        r = await c.put(url, params={"path": "/f"}, content=b"z" * 4000)
        assert r.status_code == 200 and r.json()["size"] == 4000
        assert_envelope(await c.put(url, params={"path": "/f"}, content=b"z" * 5001), 413)
        r = await c.post(f"/v1/sandboxes/{sid}/processes/42/stdin", content=b"z" * 4000)
        assert r.status_code == 204, r.text


@pytest.mark.parametrize("value", ["0", "1024"])
def test_max_body_setting_validation(value: str) -> None:
    from pandastack.server.settings import Settings

    if value == "0":
        with pytest.raises(ValueError):
            Settings(max_body_bytes=0)
    else:
        assert Settings.from_env({"PANDASTACK_MAX_BODY_KB": value}).max_body_bytes == 1 << 20


def post_without_reading(url: str, headers: dict[str, str], body: bytes) -> bytes:
    """Sends a whole request before reading a byte, as httpx does, then reads to EOF; what a
    client that got a reset instead of the answer sees is an OSError (returned as b"")."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (f"POST /v1/sandboxes HTTP/1.1\r\nHost: {parts.netloc}\r\n{head}"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        # refused early, the send fails: the answer may still be there to read
        with contextlib.suppress(OSError):
            s.sendall(request.encode() + body)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except OSError:
            return b""
        return answer


def test_a_refused_body_sent_whole_still_gets_its_413_not_a_reset(tmp_path: Path) -> None:
    """A JSON body a little over the limit (as the SDK's write_many sends one) used to be
    answered and the socket closed with the body unread: the kernel then reset the
    connection and the client saw "connection reset by peer" instead of the 413."""
    with fake_server(tmp_path) as srv:
        body = b'{"x": "' + b"y" * (3 << 20) + b'"}'
        answers = [post_without_reading(srv.url, srv.headers(), body) for _ in range(10)]
    assert all(a.startswith(b"HTTP/1.1 413") for a in answers), [a[:40] for a in answers]
