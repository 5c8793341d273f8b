"""One repository's side of the distribution protocol over httpx: manifests (an index resolved
to its linux/amd64 manifest), the image config and layer blobs, every byte checked against its
digest, every size bounded, and errors typed and naming the image (ADR 0046)."""

from __future__ import annotations

import hashlib
import json
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import urljoin, urlsplit

import httpx

from pandastack.host.images.oci.auth import Challenge, Credentials, parse_challenge, pull_scope
from pandastack.host.images.oci.cache import LayerCache
from pandastack.host.images.oci.errors import (
    ImageError,
    ImageInvalid,
    ImageNotFound,
    ImageTooLarge,
    RegistryAuthError,
    RegistryUnavailable,
)
from pandastack.host.images.oci.hosts import (
    Resolve,
    check_host,
    pinned_transport,
    system_resolve,
)
from pandastack.host.images.oci.manifest import (
    ACCEPT,
    INDEX_TYPES,
    Descriptor,
    ImageConfig,
    ImageManifest,
    media_type_of,
    parse_config,
    parse_manifest,
    pick_platform,
)
from pandastack.host.images.oci.reference import ImageReference
from pandastack.host.images.oci.settings import (
    MAX_CONFIG_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_TOKEN_BYTES,
    RegistrySettings,
)

MAX_REDIRECTS = 5
BlobProgress = Callable[[int, int], None]  # bytes so far, bytes in all


@dataclass(frozen=True)
class ResolvedImage:
    reference: ImageReference
    digest: str  # what the reference names now (an index's digest for a multi-arch image)
    manifest_digest: str  # the linux/amd64 manifest's
    manifest: ImageManifest
    config: ImageConfig


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class RegistryClient:
    """Pulls from one repository; its token (scoped to that repository) lives as long as it."""

    def __init__(self, reference: ImageReference, settings: RegistrySettings,
                 credentials: Credentials | None = None, *,
                 resolve: Resolve = system_resolve, cache: LayerCache | None = None) -> None:
        """`cache`: where the image config is kept and found, as layers are (`_config`)."""
        self.reference = reference
        self._cache = cache
        self.image = str(reference)
        self._settings = settings
        self._credentials = credentials
        self._base = settings.endpoint(reference.api_host)
        self._authorization: str | None = None
        self._resolve_host = resolve
        self._public: set[str] = set()  # hosts checked (hosts.py) by this client
        # While resolving (manifests, config, token): when it must be done by, checked before
        # each request and after each chunk, so a registry dripping bytes cannot hold it.
        self._deadline: float | None = None
        # A context, not the bundle's path: httpx deprecates verify=<str>.
        verify: ssl.SSLContext | bool = \
            ssl.create_default_context(cafile=str(settings.ca_bundle)) if settings.ca_bundle \
            else True
        self._http = httpx.Client(transport=pinned_transport(self.image, settings, verify,
                                                             resolve),
                                  timeout=httpx.Timeout(settings.timeout_s),
                                  follow_redirects=False, trust_env=False)

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- requests ---------------------------------------------------------------------------

    def _unavailable(self, what: str, exc: Exception) -> RegistryUnavailable:
        kind = "did not answer in time" if isinstance(exc, httpx.TimeoutException) \
            else "could not be reached"
        return RegistryUnavailable(self.image, f"{what} {kind} ({type(exc).__name__}: {exc})")

    def _follow(self, method: str, url: str, headers: dict[str, str]) -> httpx.Response:
        """Send, following redirects by hand: only to URLs the settings allow (no HTTPS to
        HTTP), and without our Authorization once off the registry's host (blob CDNs)."""
        origin = urlsplit(self._base).netloc
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if not self._settings.allows(parts.scheme, parts.netloc):
                raise ImageInvalid(self.image, f"the registry sent us to {parts.scheme}://"
                                               f"{parts.netloc}, not HTTPS nor an insecure "
                                               "registry of the operator's")
            self._check_host(parts.scheme, parts.netloc)
            sent = dict(headers)
            if parts.netloc != origin:
                sent.pop("Authorization", None)
            try:
                response = self._http.send(self._http.build_request(method, url, headers=sent),
                                           stream=True)
            except httpx.HTTPError as exc:
                raise self._unavailable(f"registry {parts.netloc}", exc) from None
            if response.status_code not in (301, 302, 303, 307, 308) \
                    or "location" not in response.headers:
                return response
            response.close()
            url = urljoin(url, response.headers["location"])
        raise ImageInvalid(self.image, f"more than {MAX_REDIRECTS} redirects")

    def _check_host(self, scheme: str, netloc: str) -> None:
        if netloc not in self._public:
            check_host(self.image, netloc, self._settings, https=scheme == "https",
                       resolve=self._resolve_host)
            self._public.add(netloc)

    def _in_time(self) -> None:
        if self._deadline is not None and time.monotonic() > self._deadline:
            raise RegistryUnavailable(self.image, f"not resolved within "
                                                  f"{self._settings.deadline_s:g} s")

    def _send(self, method: str, path: str, *, accept: str | None = None) -> httpx.Response:
        authenticated_now = False
        while True:
            self._in_time()
            headers = {"Accept": accept} if accept else {}
            if self._authorization:
                headers["Authorization"] = self._authorization
            response = self._follow(method, self._base + path, headers)
            if response.status_code != 401:
                return response
            challenge = parse_challenge(response.headers.get("www-authenticate", ""))
            response.close()
            if authenticated_now:
                who = f"user {self._credentials.username!r}" if self._credentials \
                    else "anonymous pulls"
                raise RegistryAuthError(self.image, f"the registry refused {who}")
            self._authenticate(challenge)
            authenticated_now = True

    def _authenticate(self, challenge: Challenge | None) -> None:
        if challenge is None or challenge.scheme not in ("basic", "bearer"):
            raise RegistryAuthError(self.image, "the registry asked for an authentication "
                                                "scheme we do not speak")
        if challenge.scheme == "basic":
            if self._credentials is None:
                raise RegistryAuthError(self.image, "the registry needs credentials")
            self._authorization = self._credentials.basic_header()
            return
        realm = challenge.params.get("realm", "")
        parts = urlsplit(realm)
        if not parts.netloc or not self._settings.allows(parts.scheme, parts.netloc):
            raise RegistryAuthError(self.image, f"token service {realm!r} is not an HTTPS URL "
                                                "(nor an operator's insecure registry)")
        self._check_host(parts.scheme, parts.netloc)
        query = {"scope": challenge.params.get("scope") or pull_scope(self.reference.repository)}
        if challenge.params.get("service"):
            query["service"] = challenge.params["service"]
        headers = {"Authorization": self._credentials.basic_header()} if self._credentials \
            else {}
        try:
            response = self._http.send(
                self._http.build_request("GET", realm, params=query, headers=headers),
                stream=True)
        except httpx.HTTPError as exc:
            raise self._unavailable(f"token service {parts.netloc}", exc) from None
        if response.status_code != 200:
            response.close()
            if response.status_code in (401, 403):
                who = f"user {self._credentials.username!r}" if self._credentials \
                    else "anonymous"
                raise RegistryAuthError(self.image, f"the token service refused {who}")
            raise RegistryUnavailable(self.image, f"token service answered "
                                                  f"{response.status_code}")
        body = self._read_bounded(response, MAX_TOKEN_BYTES, "token")
        try:
            answer = json.loads(body)
            token = answer.get("token") or answer.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryAuthError(self.image, "the token service sent no token")
        self._authorization = f"Bearer {token}"

    def _check(self, response: httpx.Response, what: str) -> None:
        status = response.status_code
        if status < 300:
            return
        code = self._error_code(response)
        if status == 404:
            if code == "NAME_UNKNOWN":
                raise ImageNotFound(self.image, "the registry has no such repository")
            raise ImageNotFound(self.image, f"the registry has no {what}")
        if status == 403:
            raise RegistryAuthError(self.image, f"the registry denied access to the {what}")
        if status == 429 or status >= 500:
            raise RegistryUnavailable(self.image, f"the registry answered {status} for the "
                                                  f"{what}")
        raise ImageError(self.image, f"the registry answered {status} for the {what}")

    def _error_code(self, response: httpx.Response) -> str:
        """The first error code of a distribution-spec error body (read up to 64 KiB)."""
        try:
            body = self._read_bounded(response, 1 << 16, "error")
            errors = json.loads(body).get("errors") or []
            code = errors[0].get("code") if errors else ""
        except (ImageError, ValueError, AttributeError, TypeError, IndexError):
            return ""
        return code if isinstance(code, str) else ""

    def _read_bounded(self, response: httpx.Response, limit: int, what: str) -> bytes:
        chunks: list[bytes] = []
        total = 0
        try:
            for chunk in response.iter_raw():
                self._in_time()
                total += len(chunk)
                if total > limit:
                    raise ImageTooLarge(self.image, f"its {what} is over {limit} bytes")
                chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise self._unavailable(f"the {what}", exc) from None
        finally:
            response.close()
        return b"".join(chunks)

    # -- the protocol -----------------------------------------------------------------------

    def _manifest(self, reference: str) -> tuple[bytes, str, str]:
        response = self._send("GET", f"/v2/{self.reference.repository}/manifests/{reference}",
                              accept=ACCEPT)
        self._check(response, f"manifest {reference}")
        body = self._read_bounded(response, MAX_MANIFEST_BYTES, "manifest")
        digest = _sha256(body)
        claimed = reference if reference.startswith("sha256:") \
            else response.headers.get("docker-content-digest")
        if claimed and claimed != digest:
            raise ImageInvalid(self.image, f"manifest {reference} hashes to {digest}, not "
                                           f"{claimed}")
        return body, media_type_of(self.image, body, response.headers.get("content-type", "")), \
            digest

    def resolve(self) -> ResolvedImage:
        """The reference's manifest (its linux/amd64 one for an index) and config, within the
        settings' deadline; layer sizes and count checked against the bounds before any layer
        is fetched."""
        self._deadline = time.monotonic() + self._settings.deadline_s
        try:
            return self._resolve()
        finally:
            self._deadline = None

    def _resolve(self) -> ResolvedImage:
        body, media, digest = self._manifest(self.reference.reference)
        manifest_digest = digest
        if media in INDEX_TYPES:
            chosen = pick_platform(self.image, body)
            body, media, manifest_digest = self._manifest(chosen.digest)
            if media in INDEX_TYPES:
                raise ImageInvalid(self.image, "its linux/amd64 entry is another index")
        manifest = parse_manifest(self.image, body)
        self._check_bounds(manifest)
        config = parse_config(self.image, self._config(manifest.config))
        if config.diff_ids and len(config.diff_ids) != len(manifest.layers):
            raise ImageInvalid(self.image, f"its config lists {len(config.diff_ids)} layers, "
                                           f"its manifest {len(manifest.layers)}")
        return ResolvedImage(reference=self.reference, digest=digest,
                             manifest_digest=manifest_digest, manifest=manifest, config=config)

    def _config(self, blob: Descriptor) -> bytes:
        """The image config's bytes: from the cache when they were verified from this
        repository before, under the rule layers follow (the manifest naming their digest
        came from the registry with the caller's credentials just now: ADR 0046), so a
        rebuild of a cached image asks the registry for its manifest and nothing else."""
        source = f"{self.reference.registry}/{self.reference.repository}"
        if self._cache is not None and blob.size <= MAX_CONFIG_BYTES:
            cached = self._cache.open(blob.digest, source)
            if cached is not None:
                with cached:
                    body = cached.read(blob.size + 1)
                if len(body) == blob.size and _sha256(body) == blob.digest:
                    return body
        body = self.read_blob(blob, MAX_CONFIG_BYTES)
        if self._cache is not None:
            self._cache.add(blob.digest, source, lambda out: out.write(body)).close()
        return body

    def _check_bounds(self, manifest: ImageManifest) -> None:
        limits = self._settings
        if len(manifest.layers) > limits.max_layers:
            raise ImageTooLarge(self.image, f"has {len(manifest.layers)} layers; the bound is "
                                            f"{limits.max_layers}")
        total = sum(layer.size for layer in manifest.layers)
        if total > limits.max_image_bytes:
            raise ImageTooLarge(self.image, f"is {total} bytes; the bound is "
                                            f"{limits.max_image_bytes}")

    def _blob_response(self, blob: Descriptor) -> httpx.Response:
        response = self._send("GET", f"/v2/{self.reference.repository}/blobs/{blob.digest}")
        self._check(response, f"blob {blob.digest}")
        return response

    def read_blob(self, blob: Descriptor, limit: int) -> bytes:
        if blob.size > limit:
            raise ImageTooLarge(self.image, f"blob {blob.digest} is {blob.size} bytes; the "
                                            f"bound is {limit}")
        body = self._read_bounded(self._blob_response(blob), blob.size, f"blob {blob.digest}")
        if len(body) != blob.size or _sha256(body) != blob.digest:
            raise ImageInvalid(self.image, f"blob {blob.digest} arrived as other bytes")
        return body

    def fetch_blob(self, blob: Descriptor, out: BinaryIO,
                   progress: BlobProgress | None = None) -> None:
        """Stream a blob into `out`, stopping at its descriptor's size; raises ImageInvalid
        unless exactly those bytes with that digest arrived."""
        response = self._blob_response(blob)
        digest = hashlib.sha256()
        done = 0
        try:
            for chunk in self._chunks(response, blob):
                done += len(chunk)
                if done > blob.size:
                    raise ImageInvalid(self.image, f"blob {blob.digest} is longer than its "
                                                   f"descriptor's {blob.size} bytes")
                digest.update(chunk)
                out.write(chunk)
                if progress is not None:
                    progress(done, blob.size)
        finally:
            response.close()
        if done != blob.size or "sha256:" + digest.hexdigest() != blob.digest:
            raise ImageInvalid(self.image, f"blob {blob.digest} arrived as other bytes "
                                           f"({done} of {blob.size})")

    def _chunks(self, response: httpx.Response, blob: Descriptor) -> Iterator[bytes]:
        try:
            yield from response.iter_raw(1 << 20)
        except httpx.HTTPError as exc:
            raise self._unavailable(f"blob {blob.digest}", exc) from None
