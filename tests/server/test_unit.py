"""Pure logic: keys, envelope, settings, rate limiter, lifecycle decisions (no VMs)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from pandastack.hostport.errors import (
    AgentConnectionError,
    GuestOSError,
    SandboxNotFound,
    VMExited,
)
from pandastack.hostport.host_api.codec import decode_error, encode_error
from pandastack.server.accounts.auth import generate_key, hash_key, looks_like_key, new_api_key
from pandastack.server.accounts.ratelimit import RateLimiter
from pandastack.server.sandboxes.lifecycle import decide
from pandastack.server.settings import Settings
from pandastack.server.web.errors import envelope, from_host_error
from pandastack.wire.sandboxes import ErrorEnvelope


def test_keys_have_the_documented_shape_and_are_stored_hashed() -> None:
    keys = {generate_key() for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        assert key.startswith("psk_") and len(key) == 36 and looks_like_key(key)
    row, secret = new_api_key("ci", "team-a")
    assert row.hash == hashlib.sha256(secret.encode()).hexdigest() == hash_key(secret)
    assert secret not in (row.id, row.name, row.prefix, row.hash)
    assert secret.startswith(row.prefix) and len(row.prefix) == 12
    assert not looks_like_key("psk_short") and not looks_like_key("xyz_" + "a" * 32)
    assert not looks_like_key("psk_" + "a" * 31 + "\x00")


def test_envelope_matches_the_wire_model() -> None:
    body = envelope("not_found", "sandbox x not found", "req_1")
    assert body == {
        "error": {"code": "not_found", "message": "sandbox x not found", "request_id": "req_1"}
    }
    ErrorEnvelope.model_validate(body)


@pytest.mark.parametrize(
    ("errno", "status", "code"),
    [
        ("ENOENT", 404, "not_found"),
        ("EEXIST", 409, "conflict"),
        ("ENOTEMPTY", 409, "conflict"),
        ("EACCES", 403, "forbidden"),
        ("EPERM", 403, "forbidden"),
        ("ENOSPC", 507, "insufficient_storage"),
        ("EISDIR", 400, "bad_request"),
        ("ENOTDIR", 400, "bad_request"),
        ("EWHATEVER", 400, "bad_request"),
    ],
)
def test_guest_errno_mapping(errno: str, status: int, code: str) -> None:
    err = from_host_error(GuestOSError(errno, "msg", "/p"))
    assert (err.status, err.code) == (status, code)
    assert errno in err.message and "/p" in err.message


def test_host_error_mapping() -> None:
    assert from_host_error(AgentConnectionError("gone")).status == 503
    assert from_host_error(SandboxNotFound("sbx-1")).status == 409


def test_a_dead_vm_is_a_conflict_not_a_retry_later() -> None:
    """A request that reaches a sandbox whose VM died, before the sweep ends (or stops) it,
    was a 503 'retry later' (bench/chaos.py's QEMU kill); retrying cannot help. The same
    class comes back over the host API."""
    err = from_host_error(VMExited("sandbox sbx-1: its VM process is not running"))
    assert (err.status, err.code) == (409, "conflict") and "VM died" in err.message
    again = decode_error(encode_error(VMExited("x")).error)
    assert isinstance(again, VMExited) and from_host_error(again).status == 409


def test_settings_from_env(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "PANDASTACK_HOME": str(tmp_path),
            "PANDASTACK_IDLE_TIMEOUT": "30",
            "PANDASTACK_MAX_UPLOAD_MB": "5",
            "PANDASTACK_MAX_BODY_KB": "64",
            "PANDASTACK_PORT": "9000",
        }
    )
    assert s.max_body_bytes == 64 << 10
    assert s.dsn == f"sqlite:///{tmp_path}/pandastack.db"
    assert (s.idle_timeout_seconds, s.max_upload_bytes, s.port) == (30, 5 << 20, 9000)
    assert s.api_url == "http://127.0.0.1:9000"
    assert Settings.from_env({"PANDASTACK_DB": "postgresql://x/y"}).dsn == "postgresql://x/y"
    defaults = Settings.from_env({})
    assert (defaults.host, defaults.port, defaults.idle_timeout_seconds) == ("127.0.0.1", 8080, 600)
    assert defaults.retention_seconds == 3600
    assert defaults.max_body_bytes == 1 << 20
    with pytest.raises(ValueError, match="PANDASTACK_IDLE_TIMEOUT"):
        Settings.from_env({"PANDASTACK_IDLE_TIMEOUT": "soon"})
    with pytest.raises(ValueError):
        Settings.from_env({"PANDASTACK_IDLE_TIMEOUT": "0"})


def test_rate_limiter_token_bucket() -> None:
    now = [0.0]
    rl = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [rl.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = rl.take("a")
    assert wait == pytest.approx(0.5)
    assert rl.take("b") == 0.0  # buckets are per key
    now[0] += 0.5
    assert rl.take("a") == 0.0
    now[0] += 100
    assert [rl.take("a") for _ in range(4)][:3] == [0.0, 0.0, 0.0]  # refills to burst only


def _decide(**kw: object) -> str | None:
    args: dict[str, object] = {
        "state": "running",
        "persistent": False,
        "expires_at": 100.0,
        "last_activity_at": 0.0,
        "busy": False,
        "now": 50.0,
        "idle_timeout": 60.0,
    }
    args.update(kw)
    verdict = decide(**args)  # type: ignore[arg-type]
    return None if verdict is None else verdict.state


def test_lifecycle_decisions() -> None:
    assert _decide() is None
    assert _decide(now=100.0) == "expired"
    assert _decide(now=70.0) == "reaped"
    assert _decide(now=70.0, busy=True) is None  # an operation in flight holds off idling
    assert _decide(now=150.0, busy=True) == "expired"  # but never the TTL
    assert _decide(now=1e9, persistent=True) is None
    assert _decide(now=1e9, state="starting") is None
    assert _decide(now=1e9, state="killed") is None
    assert _decide(now=1e9, expires_at=None, last_activity_at=1e9 - 1) is None
