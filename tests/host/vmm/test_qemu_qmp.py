"""`connect_qmp`'s retry bound on a socket that refuses (a dead VMM's): the module's
QMP_CONNECT_S, read at each call, so a test of that path need not wait the product's 30 s
(tests/host/runtime/test_runtime_migration.py shortens it). No VM."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from pandastack.host.vmm.qemu import qmp
from pandastack.hostport.errors import VMMError


def refusing_socket(tmp_path: Path) -> Path:
    """A unix socket path whose listener is gone: connects are refused, as at a dead QEMU."""
    path = tmp_path / "qmp.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()
    return path


async def test_the_product_default_is_thirty_seconds() -> None:
    assert qmp.QMP_CONNECT_S == qmp.QMP_TIMEOUT_S == 30.0


async def test_a_shortened_setting_bounds_the_retries(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = refusing_socket(tmp_path)
    monkeypatch.setattr(qmp, "QMP_CONNECT_S", 0.3)
    started = time.monotonic()
    with pytest.raises(VMMError, match="did not answer"):
        await qmp.connect_qmp(path)
    took = time.monotonic() - started
    # It retried up to the setting, and gave up long before the product's 30 s.
    assert 0.3 <= took < 10, took


async def test_an_explicit_timeout_wins_over_the_setting(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    path = refusing_socket(tmp_path)
    monkeypatch.setattr(qmp, "QMP_CONNECT_S", 60.0)
    started = time.monotonic()
    with pytest.raises(VMMError):
        await qmp.connect_qmp(path, timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 10
