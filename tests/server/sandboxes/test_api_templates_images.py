"""A build FROM an image at the HTTP layer (issue 37): the image is asked of its registry when
the build is requested, so a missing image or tag (404), a registry that refuses us (403), one
that does not answer (502) or an image over the bounds (413) is the request's answer naming the
image, within a deadline, and no version is made; a ready version lists the image's
ExposedPorts. The registry is a real one on loopback (Debian's docker-registry) and the
host's lookup is the real one (`image_base.inspect_image`); only the build's VM is the fake's.
The same through real VMs: tests/e2e/test_templates_oci.py."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from pandastack.host.images.oci.settings import RegistrySettings
from pandastack.host.templates.image_base import inspect_image
from pandastack.hostport.errors import HostUnavailable, ImageNotFound, RegistryAuthError
from pandastack.hostport.registries import RegistryLogin, RegistryLogins
from pandastack.hostport.results import ImageInfo
from tests.host.images.oci.conftest import (
    PASSWORD,
    USER,
    basic_registry,
    needs_registry,
    registry,
    skopeo_policy,
)
from tests.host.images.oci.helpers import push_image
from tests.host.images.oci.layers import file, gzipped
from tests.host.images.oci.registry import Registry
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime, ScriptedBuilder

__all__ = ["basic_registry", "registry", "skopeo_policy"]  # the OCI tests' fixtures, by name


class RegistryRuntime(FakeRuntime):
    """The fake host, but images are looked up in real registries by the host's own code
    (what it found is what the fake build reports, ExposedPorts included)."""

    def __init__(self, root: Path, settings: RegistrySettings) -> None:
        super().__init__(root)
        self.registry_settings = settings

    async def inspect_image(self, reference: str, *,
                            registry_logins: RegistryLogins | None = None) -> ImageInfo:
        self.inspected.append(reference)
        info = await asyncio.to_thread(inspect_image, reference, self.registry_settings,
                                       logins=registry_logins)
        self.images[reference] = info
        return info


@pytest.fixture
def silent() -> Iterator[str]:
    """A registry address that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def runtime(tmp_path: Path, registry: Registry, basic_registry: Registry,
            silent: str) -> RegistryRuntime:
    return RegistryRuntime(tmp_path, RegistrySettings(
        insecure=frozenset({registry.host, basic_registry.host, silent}), max_layers=2,
        deadline_s=3.0))


@pytest.fixture
async def api(tmp_path: Path, runtime: RegistryRuntime) -> AsyncIterator[Api]:
    async with running_app(make_settings(tmp_path), runtime,
                           builder=ScriptedBuilder(runtime)) as running:
        yield running


async def build(api: Api, name: str, base: str, **spec: Any) -> Any:
    return await api.client.post("/v1/templates",
                                 json={"name": name, "spec": {"from_template": base, **spec}})


async def ready(api: Api, build_id: str) -> dict[str, Any]:
    for _ in range(500):
        r = await api.client.get(f"/v1/templates/builds/{build_id}")
        if r.json()["status"] != "building":
            assert r.json()["status"] == "ready", r.text
            info: dict[str, Any] = r.json()
            return info
        await asyncio.sleep(0.01)
    raise AssertionError("the build never ended")


@needs_registry
async def test_a_version_from_an_image_lists_its_exposed_ports(
        api: Api, runtime: RegistryRuntime, registry: Registry, skopeo_policy: Path,
        tmp_path: Path) -> None:
    push_image(registry, tmp_path, skopeo_policy, "tests/ports",
               [gzipped([file("srv/app", "app")])],
               config={"ExposedPorts": {"8080/tcp": {}, "53/udp": {}}})
    r = await build(api, "web", f"{registry.host}/tests/ports:v1")
    assert r.status_code == 202, r.text
    assert r.json()["exposed_ports"] == []  # known once built
    done = await ready(api, r.json()["build_id"])
    assert done["exposed_ports"] == ["53/udp", "8080/tcp"]
    versions = (await api.client.get("/v1/templates/web")).json()["versions"]
    assert [v["exposed_ports"] for v in versions] == [["53/udp", "8080/tcp"]]
    listed = (await api.client.get("/v1/templates")).json()["templates"]
    assert [t["exposed_ports"] for t in listed if t["name"] == "web"] == [["53/udp", "8080/tcp"]]
    # FROM a template: no image, no ports (and no registry asked).
    assert runtime.inspected == [f"{registry.host}/tests/ports:v1"]
    r = await build(api, "plain", "base")
    assert (await ready(api, r.json()["build_id"]))["exposed_ports"] == []
    assert len(runtime.inspected) == 1
    # The spec's own (a Dockerfile's EXPOSE) join the image's, each once, in Docker's form;
    # FROM a template they are the only ones.
    r = await build(api, "web2", f"{registry.host}/tests/ports:v1",
                    exposed_ports=["9000", "8080/tcp", "53/UDP"])
    assert (await ready(api, r.json()["build_id"]))["exposed_ports"] == [
        "53/udp", "8080/tcp", "9000/tcp"]
    logs = (await api.client.get(f"/v1/templates/builds/{r.json()['build_id']}/logs")).text
    assert "exposes 53/udp, 8080/tcp, 9000/tcp" in logs
    r = await build(api, "plain", "base", exposed_ports=["8000"])
    assert (await ready(api, r.json()["build_id"]))["exposed_ports"] == ["8000/tcp"]
    r = await build(api, "bad", "base", exposed_ports=["80/http"])
    assert_envelope(r, 422, "validation_error")
    assert "the protocol is tcp, udp or sctp, not 'http'" in r.json()["error"]["message"]


@needs_registry
async def test_a_missing_image_or_tag_is_the_requests_404_naming_it(
        api: Api, runtime: RegistryRuntime, registry: Registry, skopeo_policy: Path,
        tmp_path: Path) -> None:
    push_image(registry, tmp_path, skopeo_policy, "tests/tagged", [gzipped([file("a", "a")])])
    for image, said in ((f"{registry.host}/tests/tagged:nope", "no manifest nope"),
                        (f"{registry.host}/tests/absent:v1", "no manifest v1")):
        r = await build(api, "missing", image)
        assert_envelope(r, 404, "not_found")
        message = r.json()["error"]["message"]
        assert message.startswith(f"image {image}: ") and said in message, message
    # Nothing was made of it: no version, no build.
    assert_envelope(await api.client.get("/v1/templates/missing"), 404, "not_found")
    assert runtime.builder is not None and runtime.builder.specs == []


@needs_registry
async def test_a_stage_from_a_missing_image_fails_the_request_too(
        api: Api, registry: Registry) -> None:
    image = f"{registry.host}/tests/no-stage:v1"
    spec = {"stages": [{"name": "tools", "from_template": image, "steps": []}],
            "steps": [{"kind": "copy_from", "stage": 0, "sources": ["/out"], "dst": "/opt/"}]}
    r = await build(api, "staged", "base", **spec)
    assert_envelope(r, 404, "not_found")
    assert image in r.json()["error"]["message"]


@needs_registry
async def test_a_registry_that_wants_credentials_is_a_403_naming_the_image(
        api: Api, basic_registry: Registry) -> None:
    image = f"{basic_registry.host}/tests/private:v1"
    r = await build(api, "private", image)
    assert_envelope(r, 403, "forbidden")
    assert r.json()["error"]["message"] == f"image {image}: the registry needs credentials"


@needs_registry
def test_the_lookup_logs_in_with_the_login_for_the_images_registry(
        runtime: RegistryRuntime, basic_registry: Registry, skopeo_policy: Path,
        tmp_path: Path) -> None:
    push_image(basic_registry, tmp_path, skopeo_policy, "tests/private",
               [gzipped([file("a", "a")])], config={"ExposedPorts": {"22/tcp": {}}},
               creds=f"{USER}:{PASSWORD}")
    image = f"{basic_registry.host}/tests/private:v1"
    settings = runtime.registry_settings
    found = inspect_image(image, settings,
                          logins={basic_registry.host: RegistryLogin(USER, PASSWORD)})
    assert (found.reference, found.layers, found.exposed_ports) == (image, 1, ("22/tcp",))
    with pytest.raises(RegistryAuthError, match=f"image {image}: the registry refused user"):
        inspect_image(image, settings,
                      logins={basic_registry.host: RegistryLogin(USER, "wrong")})
    with pytest.raises(RegistryAuthError, match="needs credentials"):  # another registry's
        inspect_image(image, settings, logins={"ghcr.io": RegistryLogin(USER, PASSWORD)})


@needs_registry
async def test_a_registry_that_does_not_answer_is_a_502_within_the_deadline(
        api: Api, silent: str) -> None:
    image = f"{silent}/tests/x:v1"
    started = time.monotonic()
    r = await build(api, "silent", image)
    assert_envelope(r, 502, "bad_gateway")
    assert r.json()["error"]["message"].startswith(f"image {image}: "), r.text
    assert time.monotonic() - started < 3.0 + 1.5 + 2  # the deadline, one stalled read, slack


@needs_registry
async def test_an_image_over_the_bounds_is_a_413(api: Api, registry: Registry,
                                                 skopeo_policy: Path, tmp_path: Path) -> None:
    layers = [gzipped([file(f"f{n}", f"{n}")]) for n in range(3)]
    push_image(registry, tmp_path, skopeo_policy, "tests/layers3", layers)
    r = await build(api, "big", f"{registry.host}/tests/layers3:v1")
    assert_envelope(r, 413, "payload_too_large")
    assert "3 layers; the bound is 2" in r.json()["error"]["message"]


async def test_a_host_that_cannot_be_asked_leaves_the_answer_to_the_build(
        tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path)
    runtime.images["reg.example/app:1"] = HostUnavailable("no host answers")
    runtime.images["reg.example/gone:1"] = ImageNotFound("image reg.example/gone:1: no such")
    async with running_app(make_settings(tmp_path), runtime,
                           builder=ScriptedBuilder(runtime)) as api:
        r = await build(api, "app", "reg.example/app:1")
        assert r.status_code == 202, r.text
        await ready(api, r.json()["build_id"])
        assert_envelope(await build(api, "gone", "reg.example/gone:1"), 404, "not_found")
