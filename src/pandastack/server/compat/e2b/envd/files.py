"""E2B daemon's plain HTTP routes (spec/envd/envd.yaml): `GET /files` (download, streamed),
`POST /files` (upload: multipart with one or more files, or one octet-stream body, gzip
allowed), `GET /health`, `GET /envs`, `GET /metrics`. Errors are E2B's
`{"code": status, "message"}`.

A `signature` query parameter is checked as E2B's SDKs compute it client-side
(`e2b/sandbox/signature.py`): `v1_` + unpadded base64 of SHA-256 over
`path:operation:user:envdAccessToken[:expiration]`, with the path and user exactly as the
URL carries them. Such a URL is what a browser or curl uses without the access token: the
listener may let a call through on `signed_request` instead of the token; the routes here
check a signature whenever one is given.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import posixpath
import time
import urllib.parse
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from pandastack.hostport.protocols import SandboxPort
from pandastack.server.routes.files import held_chunks
from pandastack.server.store import Store

from ..errors import E2bError, e2b_response
from ..target import SandboxTarget, target_of
from ..tokens import tokens_for
from .guestfs import ROOT, e2b_error_of, ensure, resolve, set_metadata, user_of
from .lister import metadata_of

MAX_UPLOAD_FILES = 100
READ_CHUNK = 1 << 20
# Uploads up to this size go to the guest as one exec's stdin (held here meanwhile); bigger
# ones stream through the agent's write_file.
SMALL_WRITE = 1 << 20


def _e2b(handler: Callable[[Request], Awaitable[Response]]
         ) -> Callable[[Request], Awaitable[Response]]:
    """Our errors as E2B's shape; anything else is a bug of ours and propagates."""
    async def call(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception as exc:
            found = e2b_error_of(exc)
            if found is None:
                raise
            return e2b_response(found.status, found.message)
    return call


def expected_signature(path: str, operation: str, user: str, token: str,
                       expiration: int | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def signed_request(conn: HTTPConnection, sandbox_id: str, store: Store) -> bool:
    """Whether `conn` is a `/files` call opened by its URL's signature (True), or carries
    none (False: the access token must open it); 401 in E2B's words for a wrong or expired
    one. Needs no lookup: the listener may call it before it knows the sandbox exists."""
    query = conn.query_params
    signature = query.get("signature")
    expiration_text = query.get("signature_expiration")
    if signature is None:
        if expiration_text is not None:
            raise E2bError(400, "signature_expiration requires signature")
        return False
    if conn.url.path != "/files" or conn.scope.get("method") not in ("GET", "POST"):
        raise E2bError(401, "only /files takes a signature")
    expiration: int | None = None
    if expiration_text is not None:
        try:
            expiration = int(expiration_text)
        except ValueError:
            raise E2bError(400, "signature_expiration must be a Unix time in seconds") from None
    operation = "read" if conn.scope["method"] == "GET" else "write"
    token = tokens_for(store).envd_access(sandbox_id)
    want = expected_signature(query.get("path", ""), operation, query.get("username", ""),
                              token, expiration)
    if not hmac.compare_digest(want.encode(), signature.encode("utf-8", "replace")):
        raise E2bError(401, "invalid signature")
    if expiration is not None and expiration < int(time.time()):
        raise E2bError(401, "signature is already expired")
    return True


async def _running(target: SandboxTarget) -> SandboxPort:
    _, handle = await target.service.running(target.team, target.sandbox_id)
    return handle


def _attachment(path: str) -> str:
    name = posixpath.basename(path) or "file"
    return f"attachment; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


@_e2b
async def download(request: Request) -> Response:
    target = target_of(request)
    signed_request(request, target.sandbox_id, target.service.store)
    user = user_of(target, request.query_params.get("username") or None)
    path = resolve(request.query_params.get("path", ""), user)
    handle = await _running(target)
    chunks = handle.read_file(path)
    try:  # the first step surfaces ENOENT & co. while a status can still say so
        first = await anext(chunks)
    except StopAsyncIteration:
        first = b""
    except Exception as exc:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
        found = e2b_error_of(exc)
        if found is not None and "EISDIR" in found.message:
            raise E2bError(400, f"path '{path}' is a directory") from None
        raise

    return StreamingResponse(held_chunks(target.service, target.sandbox_id, first, chunks),
                             media_type="application/octet-stream",
                             headers={"Content-Disposition": _attachment(path)})


class _Limited:
    """The request body, gunzipped if it says so, cut off past `limit` bytes (413)."""

    def __init__(self, request: Request, limit: int) -> None:
        self.request = request
        self.limit = limit
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip"):
            raise E2bError(400, f"unsupported Content-Encoding {encoding[:40]!r}")
        self.gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        self.seen = 0

    def _count(self, data: bytes) -> bytes:
        self.seen += len(data)
        if self.seen > self.limit:
            raise E2bError(413, f"upload over the {self.limit}-byte limit")
        return data

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        async for chunk in self.request.stream():
            if self.gunzip is None:
                if chunk:
                    yield self._count(chunk)
                continue
            try:
                # bounded output per step: a small gzip bomb cannot inflate at once
                data = self.gunzip.decompress(chunk, READ_CHUNK)
                while data:
                    yield self._count(data)
                    data = self.gunzip.decompress(self.gunzip.unconsumed_tail, READ_CHUNK)
            except zlib.error:
                raise E2bError(400, "the body is not valid gzip") from None
        if self.gunzip is not None and not self.gunzip.eof:
            raise E2bError(400, "the gzip body ends early")


async def _small_or_stream(chunks: AsyncIterator[bytes]) -> bytes | AsyncIterator[bytes]:
    """The whole upload if it is at most SMALL_WRITE bytes, else a stream of all of it."""
    head = bytearray()
    async for chunk in chunks:
        head += chunk
        if len(head) > SMALL_WRITE:
            break
    else:
        return bytes(head)

    async def rest() -> AsyncIterator[bytes]:
        yield bytes(head)
        async for more in chunks:
            yield more
    return rest()


async def _write(target: SandboxTarget, handle: SandboxPort, user: str, path: str,
                 chunks: AsyncIterator[bytes], metadata: dict[str, str] | None
                 ) -> dict[str, object]:
    async with target.service.busy(target.sandbox_id):
        data = await _small_or_stream(chunks)
        if isinstance(data, bytes):  # one exec: parents, the file, its owner, its metadata
            await ensure(handle, user, "stdin", path, data, metadata)
        else:
            if user != ROOT:  # made and owned by the user first; the write keeps its owner
                await ensure(handle, user, "file", path)
            await handle.write_file(path, data, mode=0o644)
            await set_metadata(handle, path, metadata)
    written: dict[str, object] = {"name": posixpath.basename(path), "type": "file",
                                  "path": path}
    if metadata:
        written["metadata"] = metadata
    return written


async def _spooled(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(READ_CHUNK):
        yield chunk


@_e2b
async def upload(request: Request) -> Response:
    target = target_of(request)
    signed_request(request, target.sandbox_id, target.service.store)
    query = request.query_params
    user = user_of(target, query.get("username") or None)
    limit = target.service.settings.max_upload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit and "content-encoding" not in request.headers:
        raise E2bError(413, f"upload over the {limit}-byte limit")
    metadata = metadata_of(request.headers.raw)
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = _Limited(request, limit)
    if media == "application/octet-stream":
        if not query.get("path"):
            raise E2bError(400, "an application/octet-stream upload needs the path parameter")
        handle = await _running(target)
        one = await _write(target, handle, user, resolve(query["path"], user), body.chunks(),
                           metadata)
        return JSONResponse([one])
    if media != "multipart/form-data":
        raise E2bError(400, "upload as multipart/form-data or application/octet-stream, not "
                       f"{media[:60] or 'no Content-Type'}")
    # The parts spool to temporary files past 1 MiB: the server never holds an upload whole.
    parser = MultiPartParser(request.headers, body.chunks(), max_files=MAX_UPLOAD_FILES,
                             max_fields=MAX_UPLOAD_FILES)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise E2bError(400, f"malformed multipart body: {exc.message}") from None
    try:
        files = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
        if not files:
            raise E2bError(400, "the multipart body has no file part")
        single = query.get("path") if len(files) == 1 else None
        targets = []
        for f in files:
            name = single or f.filename
            if not name:
                raise E2bError(400, "a file part needs a file name (its path) or the path "
                               "parameter")
            targets.append(resolve(name, user))
        handle = await _running(target)
        written = [await _write(target, handle, user, path, _spooled(f), metadata)
                   for f, path in zip(files, targets, strict=True)]
    finally:
        await form.close()
    return JSONResponse(written)


async def health(request: Request) -> Response:
    return Response(status_code=204)


@_e2b
async def envs(request: Request) -> Response:
    target = target_of(request)
    row = target.service.row(target.team, target.sandbox_id, touch=False)
    return JSONResponse({str(k): str(v) for k, v in (row.env or {}).items()})


@_e2b
async def metrics(request: Request) -> Response:
    target = target_of(request)
    m = await (await _running(target)).metrics()
    return JSONResponse({
        "ts": int(time.time()),
        "cpu_count": m.cpu_count,
        "cpu_used_pct": round(m.cpu_percent, 2),
        "mem_total": m.memory_total_bytes,
        "mem_used": m.memory_used_bytes,
        "mem_total_mib": m.memory_total_bytes >> 20,
        "mem_used_mib": m.memory_used_bytes >> 20,
        "disk_used": m.disk_used_bytes,
        "disk_total": m.disk_total_bytes,
    })


ROUTES: list[BaseRoute] = [
    Route("/files", download, methods=["GET"]),
    Route("/files", upload, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/envs", envs, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
