"""A template built FROM a ~100 MB image on a loopback registry (issue 37, "Performance"): the
first build (the pull, the guest image made of its layers, the template's bake, one step) and
the cached rebuild of the same spec, which must read nothing from the registry but the
manifest (ADR 0046: it is asked for every time; layers, guest image, template and step come
from the host's caches).

Every request the builds send goes through a counting proxy in front of Debian's
docker-registry (the tests' registry, tests/host/images/oci/registry.py); the images are
pushed to the registry directly with skopeo, so only the builds' reads are counted. Each
round pushes a new image (fresh random data), so its first build finds nothing cached;
what a round added to the host's caches (layers, guest image, template) is removed after it.

Usage: python bench/image_build.py [--n 3] [--mb 100] [--layers 4]
Needs root, docker-registry and skopeo (make deps) and the base image (pandastack setup).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import http.server
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from common import line as _line
from common import pct, temp_runtime
from pandastack.host.config import HostConfig
from pandastack.host.memory.stage import sweep as sweep_staged_memory
from pandastack.host.templates.builds import TemplateBuilds
from pandastack.templatespec import Template

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.*
from tests.host.images.oci.layers import (
    Layout,
    busybox_layer,
    file,
    gzipped,
    layer_digest,
    skopeo_push,
)
from tests.host.images.oci.registry import run_registry

line = partial(_line, unit="s", width=52)
MB = 1_000_000
CHUNK = 1 << 20
# Left as the upstream sent them: the proxy frames each answer itself (Content-Length).
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    status: int
    bytes: int

    @property
    def kind(self) -> str:
        return "manifest" if "/manifests/" in self.path else \
            "blob" if "/blobs/" in self.path else self.path


class CountingProxy:
    """Forwards each request to the registry and records it (method, path, status, bytes)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy.forward(self)

            def do_HEAD(self) -> None:
                proxy.forward(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def forward(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        conn = http.client.HTTPConnection(self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() != "host"}
            conn.request(handler.command, handler.path, headers=headers)
            answer = conn.getresponse()
            body = b"" if handler.command == "HEAD" else answer.read()
            handler.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in HOP_HEADERS:
                    handler.send_header(key, value)
            length = answer.getheader("Content-Length") if handler.command == "HEAD" \
                else str(len(body))
            handler.send_header("Content-Length", length or "0")
            handler.end_headers()
            for start in range(0, len(body), CHUNK):
                handler.wfile.write(body[start:start + CHUNK])
        finally:
            conn.close()
        with self._lock:
            self.requests.append(Request(handler.command, handler.path, answer.status,
                                         len(body)))

    def take(self) -> list[Request]:
        with self._lock:
            taken, self.requests = self.requests, []
        return taken

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def data_layers(total_bytes: int, layers: int, files_per_layer: int = 32) -> list[bytes]:
    """Gzipped layers of about `total_bytes` in all, of fresh random data as base64 text
    (gzip takes it back to about the random bytes: the files unpack to 4/3 of the layers, as
    code and libraries do), so no layer is cached anywhere yet."""
    per_file = total_bytes // (layers * files_per_layer)
    out = []
    for n in range(layers):
        entries = [file(f"bench/layer{n}/f{i}", base64.b64encode(os.urandom(per_file)))
                   for i in range(files_per_layer)]
        out.append(gzipped(entries))
    return out


def push(registry: str, tmp: Path, policy: Path, repository: str,
         layers: list[bytes]) -> tuple[str, str]:
    """Push an image made of `layers`; its manifest's digest and its config's."""
    layout = Layout(tmp / repository.replace("/", "_"))
    manifest = layout.image(layers, {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]})
    skopeo_push(layout.tag(manifest, "v1"), f"{registry}/{repository}:v1", policy)
    body = (layout.path / "blobs" / "sha256" / str(manifest["digest"]).split(":")[1])
    config = str(json.loads(body.read_text())["config"]["digest"])
    shutil.rmtree(layout.path)
    return str(manifest["digest"]), config


def summary(requests: list[Request]) -> str:
    counts: dict[str, list[int]] = {}
    for r in requests:
        entry = counts.setdefault(f"{r.method} {r.kind}", [0, 0])
        entry[0] += 1
        entry[1] += r.bytes
    return ", ".join(f"{what} x{n} ({size / MB:.2f} MB)" for what, (n, size) in counts.items())


def remove_round(config: HostConfig, manifest_digest: str, blob_digests: list[str]) -> None:
    """What a round left in the host's caches: its guest image, the template baked of it
    and its staged memory, its layers and config."""
    images = config.home / "cache" / "images"
    for meta in images.glob("*/image.json"):
        if json.loads(meta.read_text()).get("manifest_digest") == manifest_digest:
            key = meta.parent.name
            shutil.rmtree(meta.parent, ignore_errors=True)
            shutil.rmtree(config.templates_dir / f"oci-{key[:16]}", ignore_errors=True)
    blobs = config.home / "cache" / "oci" / "blobs" / "sha256"
    for digest in blob_digests:
        hexdigest = digest.split(":")[1]
        for path in (blobs / hexdigest, blobs / f"{hexdigest}.sources"):
            path.unlink(missing_ok=True)
    sweep_staged_memory(config.memory_stage_dir, progress=lambda _: None)


@contextlib.contextmanager
def registry_behind_proxy(tmp: Path) -> Iterator[tuple[str, CountingProxy]]:
    with run_registry(tmp / "registry") as registry:
        proxy = CountingProxy(registry.host)
        try:
            yield registry.host, proxy
        finally:
            proxy.close()


@dataclass
class Figures:
    first: list[float]
    cached: list[float]
    reads_first: list[list[Request]]
    reads_cached: list[list[Request]]


async def one_round(round_no: int, args: argparse.Namespace, builds: TemplateBuilds,
                    registry: str, proxy: CountingProxy, tmp: Path, policy: Path,
                    figures: Figures) -> None:
    rt = builds.runtime
    layers = [gzipped(busybox_layer()), *data_layers(args.mb * MB, args.layers)]
    repository = f"bench/image{round_no}-{time.time_ns()}"
    manifest, config = push(registry, tmp, policy, repository, layers)
    spec = Template(f"{proxy.host}/{repository}:v1").run("test -d /bench/layer0").to_spec()
    log: list[tuple[float, str]] = []
    proxy.take()
    t0 = time.perf_counter()

    def timed(text: str) -> None:
        log.append((time.perf_counter() - t0, text))

    result = await builds.build(spec, log=timed)
    figures.first.append(time.perf_counter() - t0)
    figures.reads_first.append(proxy.take())
    rt.delete_snapshot(result.snapshot_id)
    t1 = time.perf_counter()
    again = await builds.build(spec, log=lambda text: None)
    figures.cached.append(time.perf_counter() - t1)
    figures.reads_cached.append(proxy.take())
    rt.delete_snapshot(again.snapshot_id)
    size = sum(len(layer) for layer in layers)
    print(f"round {round_no}: image {size / MB:.1f} MB in {len(layers)} layers; first "
          f"{figures.first[-1]:.1f} s, cached {figures.cached[-1]:.2f} s "
          f"({again.steps_cached}/{again.steps_total} steps cached)")
    for at, text in log:
        if "ready in" in text or "pulled" in text or "layers" in text:
            print(f"  {at:6.1f} s  {text}")
    print(f"  registry, first:  {summary(figures.reads_first[-1])}")
    print(f"  registry, cached: {summary(figures.reads_cached[-1])}")
    builds.prune_cache()
    remove_round(rt.config, manifest, [config, *(layer_digest(layer) for layer in layers)])


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--mb", type=int, default=100, help="compressed size of the image")
    parser.add_argument("--layers", type=int, default=4, help="data layers (plus busybox)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="psbi-", dir="/tmp"))
    policy = tmp / "policy.json"
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    figures = Figures([], [], [], [])
    try:
        with registry_behind_proxy(tmp) as (registry, proxy):
            os.environ["PANDASTACK_INSECURE_REGISTRIES"] = proxy.host
            async with temp_runtime("psbi-rt-") as (rt, scratch):
                builds = TemplateBuilds(rt, scratch / "build-cache")
                await rt.ensure_template()
                for round_no in range(args.n):
                    await one_round(round_no, args, builds, registry, proxy, tmp, policy,
                                    figures)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(line(f"first build FROM a {args.mb} MB image (pull, image, bake, step)",
               figures.first))
    print(line("cached rebuild", figures.cached))
    cached_reads = [r for reads in figures.reads_cached for r in reads]
    others = sorted({r.kind for r in cached_reads} - {"manifest"})
    print(f"cached rebuilds read: {summary(cached_reads)}; "
          + (f"NOT ONLY THE MANIFEST: {', '.join(others)}" if others else "only the manifest"))
    print(f"p50 first / cached: {pct(figures.first, 50) / pct(figures.cached, 50):.0f}x")


if __name__ == "__main__":
    asyncio.run(main())
