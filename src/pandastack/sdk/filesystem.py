"""`sbx.filesystem`: files inside the sandbox. `Filesystem` and its async twin `AsyncFilesystem`.

Uploads and downloads stream: `upload()` reads the local file in chunks while sending, and
`download()` writes chunks to disk as they arrive (into a temporary file in the destination's
directory, renamed into place when complete), so neither holds a whole file in memory.
"""

from __future__ import annotations

import builtins
import os
import stat as _stat
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Literal, overload

import anyio

from pandastack.sdk import _base, _files, _watch
from pandastack.sdk._http import HTTP, AsyncHTTP
from pandastack.sdk._operations import operation_call
from pandastack.sdk.byte_streams import AsyncByteStream, ByteStream
from pandastack.sdk.errors import NotFoundError
from pandastack.sdk.models import FileEntry, GlobMatches, GrepMatches, WriteResult
from pandastack.sdk.watch import AsyncWatch, Watch
from pandastack.wire import search

__all__ = ["AsyncFilesystem", "Filesystem"]

StrPath = str | os.PathLike[str]
ReadFormat = Literal["text", "bytes", "stream"]


def _upload_size(path: Path) -> int | None:
    """Content-Length for a regular file; None (chunked) for pipes and devices."""
    st = path.stat()
    return st.st_size if _stat.S_ISREG(st.st_mode) else None


#: Told the bytes moved so far after each chunk of an upload or a download (a progress bar).
Progress = Callable[[int], object]


def _chunks(f: BinaryIO, on_progress: Progress | None = None) -> Iterator[bytes]:
    sent = 0
    while chunk := f.read(_base.UPLOAD_CHUNK_SIZE):
        yield chunk
        sent += len(chunk)
        if on_progress is not None:
            on_progress(sent)


async def _achunks(path: Path, on_progress: Progress | None = None) -> AsyncIterator[bytes]:
    sent = 0
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(_base.UPLOAD_CHUNK_SIZE):
            yield chunk
            sent += len(chunk)
            if on_progress is not None:
                on_progress(sent)


class Filesystem(_base.NamespaceBase[HTTP]):
    """The filesystem of one sandbox (`sbx.filesystem`)."""

    @overload
    def read(self, path: str, format: Literal["bytes"] = "bytes") -> bytes: ...
    @overload
    def read(self, path: str, format: Literal["text"]) -> str: ...
    @overload
    def read(self, path: str, format: Literal["stream"]) -> Iterator[bytes]: ...

    def read(self, path: str, format: ReadFormat = "bytes") -> str | bytes | Iterator[bytes]:
        """The content of the file at `path`: `bytes` (default), `text` (UTF-8, bad bytes
        as U+FFFD), or `stream`: an iterator of chunks as they arrive, never the whole file
        in memory (iterate it to the end or `close()` it)."""
        call = _files.read_file_call(self._sandbox_id, path)
        if format == "stream":
            return ByteStream(self._http, call)
        if format not in ("text", "bytes"):
            raise ValueError(f"format must be 'text', 'bytes' or 'stream', not {format!r}")
        with self._http.stream(call) as response:
            data = response.read()
        return data.decode(errors="replace") if format == "text" else data

    def write(self, path: str, data: str | bytes, mode: int | None = None) -> WriteResult:
        """Create or replace the file at `path` (str is written as UTF-8; parents are created).

        `mode` is the permission bits as an int, e.g. ``0o755``; the server's default otherwise.
        """
        return self._http.run(_files.write_file_call(self._sandbox_id, path, data, mode=mode))

    def write_many(self, files: Sequence[tuple[str, str | bytes]]) -> builtins.list[WriteResult]:
        """Write several files in one request, in order (str as UTF-8; parents are created).
        The request is bounded (the server's JSON body limit: 413 past it, 422 past 1000
        files); for big files use `write()` or `upload()`."""
        return self._http.run(_watch.write_many_call(self._sandbox_id, files)).files

    def watch(self, path: str, recursive: bool = True) -> Watch:
        """Watch the directory `path` (and, `recursive`, everything under it): iterate the
        returned `Watch` for `FileEvent`s; `stop()` it when done. The watch is set up when
        this returns."""
        return Watch(self._http, _watch.watch_call(self._sandbox_id, path, recursive=recursive,
                                                   base_timeout=self._http.timeout))

    def upload(self, local_path: StrPath, remote_path: str, mode: int | None = None, *,
               on_progress: Progress | None = None) -> WriteResult:
        """Stream the local file `local_path` to `remote_path` in the sandbox
        (`on_progress`: told the bytes sent so far after each chunk)."""
        local = Path(local_path)
        with local.open("rb") as f:
            call = _files.write_file_call(self._sandbox_id, remote_path, None, mode=mode,
                                         size=_upload_size(local))
            return self._http.run(call, content=_chunks(f, on_progress))

    def download(self, remote_path: str, local_path: StrPath, *,
                 on_progress: Progress | None = None) -> int:
        """Stream the sandbox file `remote_path` to `local_path`; return the bytes written
        (`on_progress`: told the bytes received so far after each chunk).

        The local file appears only once it is complete; a failed download leaves nothing.
        """
        dst = Path(local_path)
        tmp = _files.partial_path(dst)
        written = 0
        try:
            with self._http.stream(_files.read_file_call(self._sandbox_id, remote_path)) as resp, \
                    tmp.open("xb") as f:
                for chunk in resp.iter_bytes():
                    f.write(chunk)
                    written += len(chunk)
                    if on_progress is not None:
                        on_progress(written)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return written

    def list(self, path: str) -> builtins.list[FileEntry]:
        """The entries of the directory `path`."""
        return self._http.run(_files.list_files_call(self._sandbox_id, path))

    def stat(self, path: str) -> FileEntry:
        """Type, size, mode and mtime of `path` (`NotFoundError` if it does not exist)."""
        return self._http.run(_files.stat_call(self._sandbox_id, path))

    def exists(self, path: str) -> bool:
        """Whether `path` exists (any 404 counts as "no", including a vanished sandbox)."""
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def mkdir(self, path: str, parents: bool = True) -> None:
        """Create the directory `path` (and, with `parents`, its missing parents)."""
        self._http.run(_files.mkdir_call(self._sandbox_id, path, parents=parents))

    def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file, or a directory (a non-empty one only with `recursive=True`)."""
        self._http.run(_files.remove_call(self._sandbox_id, path, recursive=recursive))

    def rename(self, src: str, dst: str) -> None:
        """Rename (move) `src` to `dst`."""
        self._http.run(_files.rename_call(self._sandbox_id, src, dst))

    def grep(self, path: str, pattern: str, ignore_case: bool = False) -> GrepMatches:
        """The lines holding the literal substring `pattern` (no regular expression) in the
        files under `path` (or in the file `path`), searched in the sandbox; binary files are
        skipped. Past the guest's bounds the result says `truncated`."""
        return self._http.run(operation_call(
            search.GREP, self._sandbox_id, path=path, pattern=pattern, ignore_case=ignore_case))

    def glob(self, path: str, pattern: str) -> GlobMatches:
        """The paths under the directory `path` that `pattern` matches (relative to `path`:
        `*` and `?` within one name, `**` any number of directories), sorted."""
        return self._http.run(operation_call(search.GLOB, self._sandbox_id, path=path,
                                           pattern=pattern))


class AsyncFilesystem(_base.NamespaceBase[AsyncHTTP]):
    """The filesystem of one sandbox (`sbx.filesystem`), async."""

    @overload
    async def read(self, path: str, format: Literal["bytes"] = "bytes") -> bytes: ...
    @overload
    async def read(self, path: str, format: Literal["text"]) -> str: ...
    @overload
    async def read(self, path: str, format: Literal["stream"]) -> AsyncIterator[bytes]: ...

    async def read(self, path: str,
                   format: ReadFormat = "bytes") -> str | bytes | AsyncIterator[bytes]:
        """The content of the file at `path`: `bytes` (default), `text` (UTF-8, bad bytes
        as U+FFFD), or `stream`: an async iterator of chunks as they arrive, never the whole
        file in memory (iterate it to the end or `aclose()` it)."""
        call = _files.read_file_call(self._sandbox_id, path)
        if format == "stream":
            return await AsyncByteStream.open(self._http, call)
        if format not in ("text", "bytes"):
            raise ValueError(f"format must be 'text', 'bytes' or 'stream', not {format!r}")
        async with self._http.stream(call) as response:
            data = await response.aread()
        return data.decode(errors="replace") if format == "text" else data

    async def write(self, path: str, data: str | bytes, mode: int | None = None) -> WriteResult:
        """Create or replace the file at `path` (str is written as UTF-8; parents are created).

        `mode` is the permission bits as an int, e.g. ``0o755``; the server's default otherwise.
        """
        return await self._http.run(_files.write_file_call(self._sandbox_id, path, data,
                                                          mode=mode))

    async def write_many(self,
                         files: Sequence[tuple[str, str | bytes]]) -> builtins.list[WriteResult]:
        """Write several files in one request, in order (str as UTF-8; parents are created).
        The request is bounded (the server's JSON body limit: 413 past it, 422 past 1000
        files); for big files use `write()` or `upload()`."""
        return (await self._http.run(_watch.write_many_call(self._sandbox_id, files))).files

    async def watch(self, path: str, recursive: bool = True) -> AsyncWatch:
        """Watch the directory `path` (and, `recursive`, everything under it): iterate the
        returned `AsyncWatch` for `FileEvent`s; `stop()` it when done. The watch is set up
        when this returns."""
        w = AsyncWatch(self._http, _watch.watch_call(self._sandbox_id, path,
                                                     recursive=recursive,
                                                     base_timeout=self._http.timeout))
        await w._start()
        return w

    async def upload(self, local_path: StrPath, remote_path: str, mode: int | None = None, *,
                     on_progress: Progress | None = None) -> WriteResult:
        """Stream the local file `local_path` to `remote_path` in the sandbox
        (`on_progress`: told the bytes sent so far after each chunk)."""
        local = Path(local_path)
        call = _files.write_file_call(self._sandbox_id, remote_path, None, mode=mode,
                                     size=_upload_size(local))
        return await self._http.run(call, content=_achunks(local, on_progress))

    async def download(self, remote_path: str, local_path: StrPath, *,
                       on_progress: Progress | None = None) -> int:
        """Stream the sandbox file `remote_path` to `local_path`; return the bytes written
        (`on_progress`: told the bytes received so far after each chunk).

        The local file appears only once it is complete; a failed download leaves nothing.
        """
        dst = Path(local_path)
        tmp = _files.partial_path(dst)
        written = 0
        try:
            call = _files.read_file_call(self._sandbox_id, remote_path)
            async with self._http.stream(call) as resp, await anyio.open_file(tmp, "xb") as f:
                async for chunk in resp.aiter_bytes():
                    await f.write(chunk)
                    written += len(chunk)
                    if on_progress is not None:
                        on_progress(written)
            os.replace(tmp, dst)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return written

    async def list(self, path: str) -> builtins.list[FileEntry]:
        """The entries of the directory `path`."""
        return await self._http.run(_files.list_files_call(self._sandbox_id, path))

    async def stat(self, path: str) -> FileEntry:
        """Type, size, mode and mtime of `path` (`NotFoundError` if it does not exist)."""
        return await self._http.run(_files.stat_call(self._sandbox_id, path))

    async def exists(self, path: str) -> bool:
        """Whether `path` exists (any 404 counts as "no", including a vanished sandbox)."""
        try:
            await self.stat(path)
        except NotFoundError:
            return False
        return True

    async def mkdir(self, path: str, parents: bool = True) -> None:
        """Create the directory `path` (and, with `parents`, its missing parents)."""
        await self._http.run(_files.mkdir_call(self._sandbox_id, path, parents=parents))

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file, or a directory (a non-empty one only with `recursive=True`)."""
        await self._http.run(_files.remove_call(self._sandbox_id, path, recursive=recursive))

    async def rename(self, src: str, dst: str) -> None:
        """Rename (move) `src` to `dst`."""
        await self._http.run(_files.rename_call(self._sandbox_id, src, dst))

    async def grep(self, path: str, pattern: str, ignore_case: bool = False) -> GrepMatches:
        """The lines holding the literal substring `pattern` (no regular expression) in the
        files under `path` (or in the file `path`), searched in the sandbox; binary files are
        skipped. Past the guest's bounds the result says `truncated`."""
        return await self._http.run(operation_call(
            search.GREP, self._sandbox_id, path=path, pattern=pattern, ignore_case=ignore_case))

    async def glob(self, path: str, pattern: str) -> GlobMatches:
        """The paths under the directory `path` that `pattern` matches (relative to `path`:
        `*` and `?` within one name, `**` any number of directories), sorted."""
        return await self._http.run(operation_call(search.GLOB, self._sandbox_id, path=path,
                                                 pattern=pattern))
