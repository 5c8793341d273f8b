"""Call builders of a sandbox's files (`sdk/filesystem.py`'s twins run them)."""

from __future__ import annotations

import secrets
from pathlib import Path

from pandastack.sdk._base import (
    Call,
    _text,
    encode,
    ignore_body,
    list_decoder,
    model_decoder,
    sandbox_path,
)
from pandastack.sdk._base import _bool as _bool
from pandastack.wire import sandboxes as wire
from pandastack.wire.sandboxes import FileEntry, WriteResult


def read_file_call(sandbox_id: str, path: str) -> Call[None]:
    """A streamed GET of a file's bytes (the twins iterate the body)."""
    return Call("GET", sandbox_path(sandbox_id, "files"), ignore_body, params={"path": path},
                headers={"Accept": "application/octet-stream"})


def write_file_call(sandbox_id: str, path: str, data: str | bytes | None, *,
                    mode: int | None = None, size: int | None = None) -> Call[WriteResult]:
    """PUT a file. `data=None`: the twin streams the body itself (`size` sets Content-Length)."""
    params = {"path": path}
    if mode is not None:
        params["mode"] = format(int(mode), "o")  # the server reads octal, as chmod does
    headers = {"Content-Type": "application/octet-stream"}
    if size is not None:
        headers["Content-Length"] = str(size)
    return Call("PUT", sandbox_path(sandbox_id, "files"), model_decoder(WriteResult),
                params=params, content=None if data is None else _text(data), headers=headers)


def list_files_call(sandbox_id: str, path: str) -> Call[list[FileEntry]]:
    return Call("GET", sandbox_path(sandbox_id, "files", "list"),
                list_decoder(wire.FileList, "entries", FileEntry), params={"path": path})


def stat_call(sandbox_id: str, path: str) -> Call[FileEntry]:
    return Call("GET", sandbox_path(sandbox_id, "files", "stat"), model_decoder(FileEntry),
                params={"path": path})


def mkdir_call(sandbox_id: str, path: str, *, parents: bool) -> Call[None]:
    body = encode(wire.MkdirRequest, path=path, parents=parents)
    return Call("POST", sandbox_path(sandbox_id, "files", "mkdir"), ignore_body, json=body)


def remove_call(sandbox_id: str, path: str, *, recursive: bool) -> Call[None]:
    return Call("DELETE", sandbox_path(sandbox_id, "files"), ignore_body,
                params={"path": path, "recursive": _bool(recursive)})


def rename_call(sandbox_id: str, src: str, dst: str) -> Call[None]:
    body = encode(wire.RenameRequest, src=src, dst=dst)
    return Call("POST", sandbox_path(sandbox_id, "files", "rename"), ignore_body, json=body)


def partial_path(dst: Path) -> Path:
    """Where a download is written before it is renamed into place (same directory)."""
    return dst.with_name(f".{dst.name}.{secrets.token_hex(4)}.part")
