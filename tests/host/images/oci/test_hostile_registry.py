"""What a hostile registry sends: the client checks each byte against what it asked for and
stops at every bound (hostile.py serves it on loopback)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pandastack.host.images.oci.auth import Credentials
from pandastack.host.images.oci.cache import LayerCache
from pandastack.host.images.oci.errors import (
    ImageInvalid,
    ImageTooLarge,
    RegistryAuthError,
    RegistryUnavailable,
)
from pandastack.host.images.oci.settings import MAX_MANIFEST_BYTES
from tests.host.images.oci.helpers import pull, settings
from tests.host.images.oci.hostile import Answer, Hostile, run_hostile
from tests.host.images.oci.layers import file, tar_bytes

CONFIG = json.dumps({"os": "linux", "architecture": "amd64"}).encode()
SECRET = Credentials("alice", "s3cret")


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    with run_hostile() as running:
        yield running


def blob_path(repository: str, data: bytes) -> str:
    return f"/v2/{repository}/blobs/sha256:{hashlib.sha256(data).hexdigest()}"


def test_a_blob_longer_than_its_descriptor_stops_at_the_descriptors_size(
        hostile: Hostile, tmp_path: Path) -> None:
    layer = tar_bytes([file("a", "b")])
    hostile.image("evil/long", CONFIG, [(layer, 512)])  # serves 10 KiB, claims 512 bytes
    cache = LayerCache(tmp_path / "cache", 1 << 30)
    with pytest.raises(ImageInvalid, match=r"evil/long:v1: blob sha256:\w+ is longer than"):
        pull(f"{hostile.host}/evil/long:v1", tmp_path, settings(hostile.host), cache)
    assert cache.size() == 0


def test_a_huge_manifest_is_refused_at_the_bound(hostile: Hostile, tmp_path: Path) -> None:
    hostile.answers["/v2/evil/huge/manifests/v1"] = Answer(
        body=b" " * (MAX_MANIFEST_BYTES + 1), headers={"Content-Type": "application/json"})
    with pytest.raises(ImageTooLarge, match="its manifest is over"):
        pull(f"{hostile.host}/evil/huge:v1", tmp_path, settings(hostile.host))


def test_a_manifest_whose_digest_header_lies_is_refused(hostile: Hostile,
                                                        tmp_path: Path) -> None:
    hostile.image("evil/lies", CONFIG, [(tar_bytes([file("a", "b")]), 10240)])
    manifest = hostile.answers["/v2/evil/lies/manifests/v1"]
    manifest.headers["Docker-Content-Digest"] = "sha256:" + "0" * 64
    with pytest.raises(ImageInvalid, match="hashes to sha256:"):
        pull(f"{hostile.host}/evil/lies:v1", tmp_path, settings(hostile.host))


def test_redirects_keep_credentials_home_and_never_go_down_to_plain_http(
        hostile: Hostile, tmp_path: Path) -> None:
    layer = tar_bytes([file("payload", "from the CDN")])
    with run_hostile() as cdn, run_hostile() as plain:
        hostile.image("team/app", CONFIG, [(layer, len(layer))])
        path = blob_path("team/app", layer)
        cdn.answers["/cdn/layer"] = Answer(body=layer)
        hostile.require = SECRET.basic_header()
        hostile.answers[path] = Answer(307, headers={"Location": f"http://{cdn.host}/cdn/layer"})
        # Basic auth over the insecure registry, the blob from a CDN it sends us to.
        _, root = pull(f"{hostile.host}/team/app:v1", tmp_path,
                       settings(hostile.host, cdn.host), credentials=SECRET)
        assert (root / "payload").read_text() == "from the CDN"
        assert any(h.get("Authorization") == SECRET.basic_header() for _, h in hostile.seen)
        assert cdn.seen and [h for _, h in cdn.seen if "Authorization" in h] == []
        # A CDN the operator did not list is plain HTTP: not followed.
        hostile.answers[path] = Answer(307, headers={"Location": f"http://{plain.host}/x"})
        with pytest.raises(ImageInvalid, match=rf"sent us to http://{plain.host}, not HTTPS"):
            pull(f"{hostile.host}/team/app:v1", tmp_path, settings(hostile.host),
                 LayerCache(tmp_path / "other-cache", 1 << 30), credentials=SECRET)
        assert plain.seen == []


def test_a_bearer_realm_on_plain_http_gets_no_credentials(hostile: Hostile,
                                                          tmp_path: Path) -> None:
    with run_hostile() as realm:
        hostile.answers["/v2/team/app/manifests/v1"] = Answer(401, headers={
            "WWW-Authenticate": f'Bearer realm="http://{realm.host}/token",service="x"'})
        with pytest.raises(RegistryAuthError, match="is not an HTTPS URL"):
            pull(f"{hostile.host}/team/app:v1", tmp_path, settings(hostile.host),
                 credentials=SECRET)
        assert realm.seen == []


def test_a_token_service_sending_too_much_is_cut_off(hostile: Hostile, tmp_path: Path) -> None:
    with run_hostile() as realm:
        realm.answers["/token"] = Answer(body=b'{"token": "' + b"x" * (2 << 20) + b'"}')
        hostile.answers["/v2/team/app/manifests/v1"] = Answer(401, headers={
            "WWW-Authenticate": f'Bearer realm="http://{realm.host}/token",service="x"'})
        with pytest.raises(ImageTooLarge, match="its token is over"):
            pull(f"{hostile.host}/team/app:v1", tmp_path, settings(hostile.host, realm.host))
        assert len(realm.seen) == 1


def test_a_dripping_registry_cannot_hold_a_resolve_past_its_deadline(
        hostile: Hostile, tmp_path: Path) -> None:
    stop = threading.Event()
    hostile.answers["/v2/evil/slow/manifests/v1"] = Answer(
        body=b"{" + b" " * 4096 + b"}", headers={"Content-Type": "application/json"}, drip=stop)
    started = time.monotonic()
    try:
        with pytest.raises(RegistryUnavailable, match=r"evil/slow:v1: not resolved within 1 s"):
            pull(f"{hostile.host}/evil/slow:v1", tmp_path,
                 settings(hostile.host, timeout_s=5.0, deadline_s=1.0))
    finally:
        stop.set()
    assert time.monotonic() - started < 5  # each byte came within the read timeout
