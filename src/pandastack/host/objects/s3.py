"""The S3 calls the object store makes, over boto3, blocking (callers run them in threads),
each failure translated into the host's errors: ObjectStoreUnavailable for what a retry
later may cure (no answer, timeouts, 5xx), ObjectNotFound, and ObjectStoreError for the
rest (credentials, no such bucket)."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import os
from collections.abc import Callable
from typing import IO, Any, TypeVar, cast

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]

from pandastack.host.objects.config import ObjectStoreConfig
from pandastack.hostport.errors import ObjectNotFound, ObjectStoreError, ObjectStoreUnavailable

T = TypeVar("T")
STREAM_CHUNK = 1 << 20

_UNREACHABLE = (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError,
                botocore.exceptions.IncompleteReadError)
# Codes of a store that is there but cannot serve now.
_BUSY_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
               "RequestTimeTooSkewed"}


class S3Bucket:
    """One bucket (and key prefix) of an S3-compatible store; thread-safe, as boto3's clients
    are."""

    def __init__(self, config: ObjectStoreConfig) -> None:
        self.config = config
        self._client: Any = None

    @property
    def client(self) -> Any:
        # Built on first use, in a worker thread: loading boto3's service model takes a while.
        if self._client is None:
            cfg = self.config
            session = boto3.session.Session(aws_access_key_id=cfg.access_key,
                                            aws_secret_access_key=cfg.secret_key,
                                            region_name=cfg.region)
            self._client = session.client("s3", endpoint_url=cfg.endpoint, config=botocore.config
                                          .Config(
                signature_version="s3v4",
                # A private endpoint has no per-bucket host names.
                s3={"addressing_style": "path" if cfg.endpoint else "auto"},
                connect_timeout=cfg.connect_timeout_s,
                read_timeout=cfg.read_timeout_s,
                retries={"max_attempts": cfg.max_attempts, "mode": "standard"},
                max_pool_connections=cfg.parallel + 4,
                # Checksums in trailers (boto3's default since 1.36) are not understood by
                # every S3 server (Swift's s3api among them); parts carry Content-MD5 instead.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ))
        return self._client

    def name(self, key: str) -> str:
        return f"{self.config.prefix}sha256/{key}"

    def manifest_name(self, name: str) -> str:
        return f"{self.config.prefix}manifests/{name}"

    def put_manifest(self, name: str, data: bytes) -> None:
        self.call("PUT manifest", lambda: self.client.put_object(
            Bucket=self.config.bucket, Key=self.manifest_name(name), Body=data,
            ContentMD5=_md5(data)))

    def get_manifest(self, name: str) -> bytes | None:
        """The manifest's bytes, or None if there is none."""
        def fetch() -> bytes:
            body = self.client.get_object(Bucket=self.config.bucket,
                                          Key=self.manifest_name(name))["Body"]
            try:
                return cast(bytes, body.read())
            finally:
                body.close()
        try:
            return self.call("GET manifest", fetch, name)
        except ObjectNotFound:
            return None

    def delete_manifest(self, name: str) -> None:
        self.call("DELETE manifest", lambda: self.client.delete_object(
            Bucket=self.config.bucket, Key=self.manifest_name(name)))

    def call(self, what: str, fn: Callable[[], T], key: str | None = None) -> T:
        """`fn()`, its failures as the host's errors (`what` names the request in them)."""
        where = self.config.describe()
        try:
            return fn()
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if code in ("404", "NoSuchKey", "NotFound") and key is not None:
                raise ObjectNotFound(f"no object {key} in the {where}") from None
            if code == "NoSuchBucket":
                raise ObjectStoreError(f"{what}: the {where} has no bucket "
                                       f"{self.config.bucket!r}") from None
            if status >= 500 or code in _BUSY_CODES:
                raise ObjectStoreUnavailable(f"{what}: the {where} answered {status} {code}: "
                                             f"{error.get('Message', '')}") from None
            raise ObjectStoreError(f"{what}: the {where} refused: {status} {code} "
                                   f"{error.get('Message', '')}") from None
        except _UNREACHABLE as exc:
            raise ObjectStoreUnavailable(f"{what}: the {where} did not answer: {exc}") from None
        except botocore.exceptions.NoCredentialsError:
            raise ObjectStoreError(f"{what}: no credentials for the {where} (set "
                                   "PANDASTACK_S3_ACCESS_KEY and PANDASTACK_S3_SECRET_KEY)"
                                   ) from None

    def size_of(self, key: str) -> int | None:
        """The object's size, or None if there is none."""
        try:
            head = self.call("HEAD", lambda: self.client.head_object(
                Bucket=self.config.bucket, Key=self.name(key)), key)
        except ObjectNotFound:
            return None
        return int(head["ContentLength"])

    def put(self, key: str, data: bytes) -> None:
        self.call("PUT", lambda: self.client.put_object(
            Bucket=self.config.bucket, Key=self.name(key), Body=data, ContentMD5=_md5(data)))

    def start_multipart(self, key: str) -> str:
        answer = self.call("CreateMultipartUpload", lambda: self.client.create_multipart_upload(
            Bucket=self.config.bucket, Key=self.name(key)))
        return str(answer["UploadId"])

    def put_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        answer = self.call(f"UploadPart {number}", lambda: self.client.upload_part(
            Bucket=self.config.bucket, Key=self.name(key), UploadId=upload_id,
            PartNumber=number, Body=data, ContentMD5=_md5(data)))
        return str(answer["ETag"])

    def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> None:
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, 1)]
        self.call("CompleteMultipartUpload", lambda: self.client.complete_multipart_upload(
            Bucket=self.config.bucket, Key=self.name(key), UploadId=upload_id,
            MultipartUpload={"Parts": parts}))

    def abort_multipart(self, key: str, upload_id: str) -> None:
        # Best effort: parts left behind cost space only (a bucket lifecycle rule ends them).
        with contextlib.suppress(ObjectStoreError):
            self.call("AbortMultipartUpload", lambda: self.client.abort_multipart_upload(
                Bucket=self.config.bucket, Key=self.name(key), UploadId=upload_id))

    def download(self, key: str, out: IO[bytes], seen: Callable[[bytes], None]) -> int:
        """Streams the object into `out`, handing each chunk to `seen` too; its size. Chunks
        of zeros are skipped over, not written (a disk image's free space stays a hole in
        the file); the caller truncates `out` to the size, in case the end is such a hole."""
        def fetch() -> int:
            body = self.client.get_object(Bucket=self.config.bucket, Key=self.name(key))["Body"]
            total = 0
            try:
                for chunk in body.iter_chunks(STREAM_CHUNK):
                    if chunk.count(0) == len(chunk):
                        out.seek(len(chunk), os.SEEK_CUR)
                    else:
                        out.write(chunk)
                    seen(chunk)
                    total += len(chunk)
            finally:
                body.close()
            return total
        return self.call("GET", fetch, key)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        def fetch() -> bytes:
            try:
                body = self.client.get_object(Bucket=self.config.bucket, Key=self.name(key),
                                              Range=f"bytes={offset}-{offset + length - 1}")
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""  # at or past the end, as a read of a file would be
                raise
            # The store sends at most the range; `length` bounds it all the same.
            return cast(bytes, body["Body"].read(length))
        return self.call("GET range", fetch, key)

    def delete(self, key: str) -> None:
        self.call("DELETE", lambda: self.client.delete_object(
            Bucket=self.config.bucket, Key=self.name(key)))

    def list_page(self, after: str | None) -> tuple[list[str], str | None]:
        """One page of keys (in order), and where the next page starts (None: the last)."""
        prefix = self.name("")
        args: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": prefix}
        if after is not None:
            args["StartAfter"] = prefix + after
        answer = self.call("LIST", lambda: self.client.list_objects_v2(**args))
        keys = [item["Key"][len(prefix):] for item in answer.get("Contents", [])]
        more = answer.get("IsTruncated") and keys
        return keys, keys[-1] if more else None

    def list_manifests(self, under: str) -> list[str]:
        prefix = self.manifest_name("")
        names: list[str] = []
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": prefix + under}
            if token is not None:
                args["ContinuationToken"] = token
            answer = self.call("LIST manifests",
                               functools.partial(self.client.list_objects_v2, **args))
            names += [item["Key"][len(prefix):] for item in answer.get("Contents", [])]
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                return names

    def list_page_with_times(self, after: str | None) -> tuple[list[tuple[str, float]],
                                                               str | None]:
        """One page of keys with their last-modified times (epoch seconds), and where the
        next page starts (None: the last)."""
        prefix = self.name("")
        args: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": prefix}
        if after is not None:
            args["StartAfter"] = prefix + after
        answer = self.call("LIST", lambda: self.client.list_objects_v2(**args))
        items = [(item["Key"][len(prefix):], item["LastModified"].timestamp())
                 for item in answer.get("Contents", [])]
        more = answer.get("IsTruncated") and items
        return items, items[-1][0] if more else None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _md5(data: bytes) -> str:
    # What the store checks a body against (not a content key: that is the sha256).
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()

