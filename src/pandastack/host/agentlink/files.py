"""The file operations of `AgentClient`: read, write, list, stat, mkdir, remove, rename, and
the listings (`listing`: every guest operation whose row has an `answer`)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, AsyncIterable, Mapping
from typing import Any

import pydantic

from pandastack.guestproto import frames as P
from pandastack.guestproto.ops import OPERATIONS, WRITE_FILE_MODE
from pandastack.host.agentlink.channel import AgentChannel
from pandastack.hostport.errors import AgentLimitError
from pandastack.hostport.results import FileInfo

MAX_LIST_ENTRIES = 100_000
"""Entries of one ``list_dir``; a bigger directory fails (list its subdirectories)."""
MAX_LIST_BYTES = 64 * 2**20
"""JSON bytes of one ``list_dir``'s entries (long names count, not only many)."""
DEFAULT_MAX_READ_BYTES = 64 * 2**20
"""Default limit of ``read_file_bytes`` (bigger files: stream them with ``read_file``)."""
MAX_LISTING_BYTES = 64 * 2**20
"""JSON bytes of one listing's answer (the guest bounds its count, not its size)."""


class FileOps(AgentChannel):
    """File transfers stream under the agent's credit; every step waits `op_timeout` at most."""

    async def read_file(
        self, path: str, *, offset: int = 0, length: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Yield the file's bytes in chunks; the agent sends ahead at most its credit.

        (An async generator: ``aclose()`` it to abandon a transfer early.)"""
        fields: dict[str, Any] = {"path": path, "offset": offset}
        if length is not None:
            fields["length"] = length
        with self._operation("read_file") as op:
            await self._request(op, fields)
            f = await self._next(op, self.op_timeout)
            if f.t != "file":
                raise self._protocol_error(f"read_file: expected 'file', got {f.t!r}")
            while True:
                f = await self._next(op, self.op_timeout)
                if f.t == "data":
                    yield f.payload
                    await self._consumed(op, len(f.payload))
                elif f.t == "eof":
                    op.finished = True
                    return
                else:
                    raise self._protocol_error(f"read_file: unexpected {f.t!r} frame")

    async def read_file_bytes(self, path: str, *, limit: int = DEFAULT_MAX_READ_BYTES) -> bytes:
        """The whole file; AgentLimitError (and the transfer cancelled) past ``limit`` bytes."""
        chunks: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self.read_file(path)) as it:
            async for chunk in it:
                size += len(chunk)
                if size > limit:
                    raise AgentLimitError(f"read_file: {path} is over {limit} bytes; "
                                          "read it as a stream")
                chunks.append(chunk)
        return b"".join(chunks)

    async def write_file(
        self,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        mode: int = WRITE_FILE_MODE,
        append: bool = False,
    ) -> int:
        """Write (create parents, truncate unless ``append``); returns bytes written."""
        with self._operation("write_file") as op:
            await self._request(op, {"path": path, "mode": mode, "append": append})
            await self._send_stream(op, data, "data", "eof", credit_timeout=self.op_timeout)
            f = await self._next(op, self.op_timeout)
            op.finished = True
            if f.t != "written":
                raise self._protocol_error(f"write_file: expected 'written', got {f.t!r}")
            size: int = self._field(f, "size", int)
            return size

    def _info(self, d: object, where: str) -> FileInfo:
        if not isinstance(d, dict):
            raise self._protocol_error(f"{where}: entry is not an object")
        try:
            info = FileInfo(
                name=str(d["name"]),
                path=str(d["path"]),
                type=str(d["type"]),
                size=int(d["size"]),
                mode=int(d["mode"]),
                mtime=float(d["mtime"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise self._protocol_error(f"{where}: bad entry ({e})") from None
        return info

    async def list_dir(self, path: str) -> list[FileInfo]:
        """The directory's entries; AgentLimitError past MAX_LIST_ENTRIES or MAX_LIST_BYTES."""
        with self._operation("list") as op:
            await self._request(op, {"path": path})
            out: list[FileInfo] = []
            size = 0
            while True:
                f = await self._next(op, self.op_timeout)
                if f.t != "entries":
                    raise self._protocol_error(f"list: expected 'entries', got {f.t!r}")
                size += len(f.payload)
                if size > MAX_LIST_BYTES:
                    raise AgentLimitError(f"list: the listing of {path} is over "
                                          f"{MAX_LIST_BYTES >> 20} MiB")
                items = self._json_list(f, "list")
                if len(out) + len(items) > MAX_LIST_ENTRIES:
                    raise AgentLimitError(f"list: {path} has more than {MAX_LIST_ENTRIES} "
                                          "entries; list its subdirectories instead")
                out.extend(self._info(d, "list") for d in items)
                if not f.header.get("more"):
                    op.finished = True
                    return out

    async def stat(self, path: str) -> FileInfo:
        f = await self._call("stat", path=path)
        return self._info(f.header, "stat")

    async def mkdir(self, path: str, *, parents: bool = True) -> None:
        await self._call("mkdir", path=path, parents=parents)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._call("remove", path=path, recursive=recursive)

    async def rename(self, src: str, dst: str) -> None:
        await self._call("rename", src=src, dst=dst)

    async def listing(self, name: str, fields: Mapping[str, Any]) -> Any:
        """The answer of the listing ``name`` (a guest operation whose row has an ``answer``:
        spec §5) with the request ``fields``, read into that dataclass."""
        answer = OPERATIONS[name].answer
        if answer is None:
            raise ValueError(f"{name} is not a listing")
        items, truncated = await self._listing_items(name, dict(fields))
        first = dataclasses.fields(answer)[0].name
        try:
            return _reader(answer).validate_python({first: items, "truncated": truncated})
        except pydantic.ValidationError as e:
            problem = e.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise self._protocol_error(f"{name}: bad answer ({where}: {problem['msg']})") from None

    async def _listing_items(self, name: str, fields: dict[str, Any]) -> tuple[list[Any], bool]:
        """The JSON array a listing streams as `data`, and its `eof`'s ``truncated``."""
        with self._operation(name) as op:
            await self._request(op, fields)
            chunks: list[bytes] = []
            size = 0
            while True:
                f = await self._next(op, self.op_timeout)
                if f.t == "eof":
                    op.finished = True
                    return self._json_array(name, b"".join(chunks)), self._field(
                        f, "truncated", bool)
                if f.t != "data":
                    raise self._protocol_error(f"{name}: unexpected {f.t!r} frame")
                size += len(f.payload)
                if size > MAX_LISTING_BYTES:
                    raise AgentLimitError(f"{name}: the answer is over "
                                          f"{MAX_LISTING_BYTES >> 20} MiB; narrow the search")
                chunks.append(f.payload)
                await self._consumed(op, len(f.payload))

    def _json_array(self, name: str, body: bytes) -> list[Any]:
        try:
            items = P.parse_json(body)
        except ValueError:
            raise self._protocol_error(f"{name}: the answer is not JSON") from None
        if not isinstance(items, list):
            raise self._protocol_error(f"{name}: the answer is not a list")
        return items


@functools.cache
def _reader(answer: type) -> pydantic.TypeAdapter[Any]:
    # Made once per answer type: building one compiles its schema.
    return pydantic.TypeAdapter(answer)
