"""Volume requests through raw frames, both agents, on this machine: only what is safe to
ask of a host (refused paths, an unknown serial, a path that is no mount). Mounting and
freezing for real is covered by the VM tests of volumes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.guest.test_agent_raw import Raw

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def raw(agent_cmd: list[str]) -> Iterator[Raw]:
    r = Raw(cmd=agent_cmd)
    r.hello()
    yield r
    r.close()


def answer(raw: Raw, op: int, t: str, **fields: Any) -> dict[str, Any]:
    raw.req(t, op, **fields)
    return raw.recv_until(op, "ok")[-1].header


@pytest.mark.parametrize("path", ["/", "/proc", "/sys/x", "/dev/../dev/sda", "/run/a",
                                  "/opt/pandastack", "/tmp/v", "relative/dir", "/tmp/../tmp"])
@pytest.mark.parametrize("t", ["mount_volume", "unmount_volume", "freeze_volume"])
def test_refused_mount_paths(raw: Raw, t: str, path: str) -> None:
    h = answer(raw, 1, t, serial="vol-x", path=path, size_bytes=1 << 20)
    assert (h["t"], h["code"]) == ("error", "EINVAL") and h["path"] == path


def test_unknown_serial_is_enodev(raw: Raw) -> None:
    h = answer(raw, 1, "mount_volume", serial="pandastack-no-such-disk", path="/mnt/v",
               size_bytes=1 << 20)
    assert (h["t"], h["code"]) == ("error", "ENODEV")
    assert "pandastack-no-such-disk" in h["message"]


@pytest.mark.parametrize("fields", [{"serial": 5, "path": "/mnt/v", "size_bytes": 1},
                                    {"serial": "s", "path": "/mnt/v", "size_bytes": 0},
                                    {"serial": "s", "path": "/mnt/v"},
                                    {"serial": "s", "path": "/mnt/v", "size_bytes": 1,
                                     "read_only": "yes"}])
def test_malformed_mounts_are_einval(raw: Raw, fields: dict[str, Any]) -> None:
    h = answer(raw, 1, "mount_volume", **fields)
    assert (h["t"], h["code"]) == ("error", "EINVAL")


def test_unmounting_a_missing_path_is_enoent(raw: Raw) -> None:
    h = answer(raw, 1, "unmount_volume", path="/nonexistent/pandastack-volume")
    assert (h["t"], h["code"], h["path"]) == ("error", "ENOENT",
                                              "/nonexistent/pandastack-volume")
