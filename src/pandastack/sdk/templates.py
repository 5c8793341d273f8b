"""`client.templates`: build the team's own templates and manage their versions.

    from pandastack import Client, Template, wait_for_port

    template = (Template("base").pip_install("flask").copy("app/", "/app").workdir("/app")
                .start("python app.py", ready=wait_for_port(8000)))
    with Client() as client:
        build = client.templates.build(template, name="my-app", on_log=print)
    # then: Sandbox.create(template="my-app") (or "my-app:1" for that version)

`build()` also takes a Dockerfile (`Path` to it, or its text with `context_dir=`) in the
subset `pandastack.templatespec.from_dockerfile` reads. Builds run on the server, inside a
microVM, step by step with a cache: an unchanged prefix of steps is never rebuilt.
"""

from __future__ import annotations

import builtins
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from pandastack.rules import DEFAULT_MEMORY_MB, DEFAULT_VCPUS
from pandastack.sdk import _base
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk._sse import SSEDecoder
from pandastack.sdk.errors import ProtocolError, TemplateBuildError
from pandastack.templatespec import Template, TemplateSpec, from_dockerfile
from pandastack.wire import resources as wire

__all__ = ["AsyncTemplates", "Templates"]

TemplateSource = Template | TemplateSpec | str | os.PathLike[str]
LogCallback = Callable[[str], object]
AsyncLogCallback = Callable[[str], Awaitable[object] | object]

#: How long `build()` follows a build by default; builds that install much under TCG are slow.
DEFAULT_BUILD_TIMEOUT = 3600.0


def to_spec(source: TemplateSource, context_dir: str | os.PathLike[str] | None,
            build_args: Mapping[str, str] | None = None) -> TemplateSpec:
    """The spec of a builder, a spec, a Dockerfile path, or Dockerfile text (its ARGs take
    `build_args`, as `docker build --build-arg`; the Dockerfile is read here, so the values
    are in the spec sent)."""
    if isinstance(source, Template):
        return source.to_spec()
    if isinstance(source, TemplateSpec):
        return source
    if isinstance(source, os.PathLike):
        path = Path(source)
        context = Path(context_dir) if context_dir is not None else path.parent
        return from_dockerfile(path.read_text(), context, build_args)
    return from_dockerfile(source, Path(context_dir) if context_dir is not None else None,
                           build_args)


def build_call(spec: TemplateSpec, name: str, vcpus: int, memory_mb: int,
               network: _base.NetworkArg | None) -> _base.Call[wire.TemplateBuildInfo]:
    body: dict[str, Any] = {"name": name, "spec": spec.model_dump(mode="json"),
                            "vcpus": vcpus, "memory_mb": memory_mb}
    if network is not None:
        body["network"] = _base.network_body(network)
    wire.BuildTemplate.model_validate(body)  # bad input fails here, before anything is sent
    return _base.Call("POST", "/v1/templates", _base.model_decoder(wire.TemplateBuildInfo),
                      json=body)


def builtin_call() -> _base.Call[list[wire.BuiltinTemplateInfo]]:
    """The built-ins ride on the team's template list (`GET /v1/templates`, its `builtin`)."""
    return _base.Call("GET", "/v1/templates", _base.list_decoder(
        wire.TemplateList, "builtin", wire.BuiltinTemplateInfo))


def _q(value: str) -> str:
    return _base.path_segment(value)


def logs_call(build_id: str, timeout_seconds: float,
              base_timeout: httpx.Timeout) -> _base.Call[None]:
    return _base.Call("GET", f"/v1/templates/builds/{_q(build_id)}/logs", _base.ignore_body,
                      headers={"Accept": "text/event-stream"},
                      timeout=_base.with_read_timeout(base_timeout, timeout_seconds))


class LogDecoder:
    """The build-log event stream: `log` lines, then one `status` (the final build info)."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()
        self.final: wire.TemplateBuildInfo | None = None

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        for event in self._sse.feed(chunk):
            if self.final is not None:
                break
            try:
                payload = _base.wire_json(event.data)
            except ValueError as exc:
                raise ProtocolError("build log: an event is not JSON") from exc
            if event.event == "log" and isinstance(payload, dict):
                lines.append(str(payload.get("line", "")))
            elif event.event == "status":
                self.final = _base.parse_model(wire.TemplateBuildInfo, payload,
                                               "build log status event")
        return lines

    def result(self) -> wire.TemplateBuildInfo:
        if self.final is None:
            raise ProtocolError("the build log ended before the build's status")
        return self.final


def check_final(info: wire.TemplateBuildInfo) -> wire.TemplateBuildInfo:
    if info.status == "failed":
        raise TemplateBuildError(f"template {info.name}:{info.version} failed to build: "
                                 f"{info.error}", build=info)
    return info


class Templates(_base.ClientBase[HTTP]):
    """`client.templates`: build, list, inspect and delete the team's templates."""

    def build(self, template: TemplateSource, name: str, *,
              context_dir: str | os.PathLike[str] | None = None, vcpus: int = DEFAULT_VCPUS,
              memory_mb: int = DEFAULT_MEMORY_MB, network: _base.NetworkArg | None = None,
              on_log: LogCallback | None = None, wait: bool = True,
              timeout_seconds: float = DEFAULT_BUILD_TIMEOUT,
              build_args: Mapping[str, str] | None = None) -> wire.TemplateBuildInfo:
        """Build a new version of template `name` and (with `wait`) follow it to the end.

        `template` is a `Template` builder, a `TemplateSpec`, a Dockerfile `Path` (its folder
        is the COPY context unless `context_dir` says otherwise) or Dockerfile text, whose ARGs
        take `build_args`. Each log line goes to `on_log`. A failed build raises
        `TemplateBuildError` naming the step. With `wait=False` the build's info comes back at
        once (status "building")."""
        spec = to_spec(template, context_dir, build_args)
        info = self._http.run(build_call(spec, name, vcpus, memory_mb, network))
        if not wait:
            return info
        for line in self.logs(info.build_id, timeout_seconds=timeout_seconds):
            if on_log is not None:
                on_log(line)
        return check_final(self.get_build(info.build_id))

    def logs(self, build_id: str,
             timeout_seconds: float = DEFAULT_BUILD_TIMEOUT) -> Iterator[str]:
        """The build's log lines: those so far, then new ones until the build ends."""
        decoder = LogDecoder()
        with self._http.stream(logs_call(build_id, timeout_seconds,
                                         self._http.timeout)) as response:
            for chunk in response.iter_bytes():
                yield from decoder.feed(chunk)
                if decoder.final is not None:
                    return
        decoder.result()

    def get_build(self, build_id: str) -> wire.TemplateBuildInfo:
        """A build's status."""
        return self._http.run(_base.Call("GET", f"/v1/templates/builds/{_q(build_id)}",
                                         _base.model_decoder(wire.TemplateBuildInfo)))

    def list(self) -> builtins.list[wire.TemplateBuildInfo]:
        """The team's templates: the newest version of each name."""
        return self._http.run(_base.Call("GET", "/v1/templates", _base.list_decoder(
            wire.TemplateList, "templates", wire.TemplateBuildInfo)))

    def builtin(self) -> builtins.list[wire.BuiltinTemplateInfo]:
        """The built-in templates (`base`, `python`, ...): every team may create sandboxes
        from them; the default one is marked."""
        return self._http.run(builtin_call())

    def get(self, name: str) -> wire.TemplateInfo:
        """Template `name` with all its versions."""
        return self._http.run(_base.Call("GET", f"/v1/templates/{_q(name)}",
                                         _base.model_decoder(wire.TemplateInfo)))

    def delete(self, name: str, version: int | None = None) -> None:
        """Delete template `name` (or one `version`); sandboxes made from it keep running."""
        params = {"version": str(version)} if version is not None else None
        self._http.run(_base.Call("DELETE", f"/v1/templates/{_q(name)}", _base.ignore_body,
                                  params=params))


class AsyncTemplates(_base.ClientBase[AsyncHTTP]):
    """`client.templates`: build, list, inspect and delete the team's templates (async)."""

    async def build(self, template: TemplateSource, name: str, *,
                    context_dir: str | os.PathLike[str] | None = None, vcpus: int = DEFAULT_VCPUS,
                    memory_mb: int = DEFAULT_MEMORY_MB, network: _base.NetworkArg | None = None,
                    on_log: AsyncLogCallback | None = None, wait: bool = True,
                    timeout_seconds: float = DEFAULT_BUILD_TIMEOUT,
                    build_args: Mapping[str, str] | None = None) -> wire.TemplateBuildInfo:
        """Build a new version of template `name` and (with `wait`) follow it to the end.

        `template` is a `Template` builder, a `TemplateSpec`, a Dockerfile `Path` (its folder
        is the COPY context unless `context_dir` says otherwise) or Dockerfile text, whose ARGs
        take `build_args`. Each log line goes to `on_log` (plain or async function). A failed
        build raises `TemplateBuildError` naming the step. With `wait=False` the build's info
        comes back at once (status "building")."""
        spec = to_spec(template, context_dir, build_args)
        info = await self._http.run(build_call(spec, name, vcpus, memory_mb, network))
        if not wait:
            return info
        async for line in self.logs(info.build_id, timeout_seconds=timeout_seconds):
            if on_log is not None:
                outcome = on_log(line)
                if inspect.isawaitable(outcome):
                    await outcome
        return check_final(await self.get_build(info.build_id))

    async def logs(self, build_id: str,
                   timeout_seconds: float = DEFAULT_BUILD_TIMEOUT) -> AsyncIterator[str]:
        """The build's log lines: those so far, then new ones until the build ends."""
        decoder = LogDecoder()
        async with self._http.stream(logs_call(build_id, timeout_seconds,
                                               self._http.timeout)) as response:
            async for chunk in response.aiter_bytes():
                for line in decoder.feed(chunk):
                    yield line
                if decoder.final is not None:
                    return
        decoder.result()

    async def get_build(self, build_id: str) -> wire.TemplateBuildInfo:
        """A build's status."""
        return await self._http.run(_base.Call("GET", f"/v1/templates/builds/{_q(build_id)}",
                                               _base.model_decoder(wire.TemplateBuildInfo)))

    async def list(self) -> builtins.list[wire.TemplateBuildInfo]:
        """The team's templates: the newest version of each name."""
        return await self._http.run(_base.Call("GET", "/v1/templates", _base.list_decoder(
            wire.TemplateList, "templates", wire.TemplateBuildInfo)))

    async def builtin(self) -> builtins.list[wire.BuiltinTemplateInfo]:
        """The built-in templates (`base`, `python`, ...): every team may create sandboxes
        from them; the default one is marked."""
        return await self._http.run(builtin_call())

    async def get(self, name: str) -> wire.TemplateInfo:
        """Template `name` with all its versions."""
        return await self._http.run(_base.Call("GET", f"/v1/templates/{_q(name)}",
                                               _base.model_decoder(wire.TemplateInfo)))

    async def delete(self, name: str, version: int | None = None) -> None:
        """Delete template `name` (or one `version`); sandboxes made from it keep running."""
        params = {"version": str(version)} if version is not None else None
        await self._http.run(_base.Call("DELETE", f"/v1/templates/{_q(name)}",
                                        _base.ignore_body, params=params))
