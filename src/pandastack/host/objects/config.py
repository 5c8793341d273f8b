"""Where the object store is and how the host talks to it, from one URL and the environment.

    PANDASTACK_OBJECT_STORE=s3://BUCKET[/PREFIX][?endpoint=URL&region=R&part_mb=8&parallel=4]

`endpoint` is any S3-compatible server (the tests' Swift, MinIO, Ceph...); without it, AWS's
own for the region. Credentials: PANDASTACK_S3_ACCESS_KEY and PANDASTACK_S3_SECRET_KEY, else
whatever boto3 finds itself (AWS_ACCESS_KEY_ID..., ~/.aws, an instance role). The endpoint and
the region may also come from PANDASTACK_S3_ENDPOINT and PANDASTACK_S3_REGION (what
scripts/s3-server prints), the URL's winning.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

OBJECT_STORE_ENV = "PANDASTACK_OBJECT_STORE"
MiB = 1 << 20
# Swift's s3api takes at most 1000 parts (AWS 10,000) of at least 5 MiB (but the last).
MAX_PARTS = 1000
MIN_PART_SIZE = 5 * MiB
MAX_PART_SIZE = 5 << 30


@dataclass(frozen=True)
class ObjectStoreConfig:
    bucket: str
    prefix: str = ""  # "" or ends with "/"
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)  # never in logs
    part_size: int = 8 * MiB
    parallel: int = 4  # parts in flight per upload (and threads per store)
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 30.0
    # Attempts per request, the first included: an unreachable store fails in seconds.
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ValueError("the object store URL names no bucket (s3://BUCKET/...)")
        if self.prefix and not self.prefix.endswith("/"):
            raise ValueError(f"object store prefix {self.prefix!r} must end with '/'")
        if not MIN_PART_SIZE <= self.part_size <= MAX_PART_SIZE:
            raise ValueError(f"part size must be 5 MiB to 5 GiB, not {self.part_size} bytes")
        if self.parallel < 1 or self.max_attempts < 1:
            raise ValueError("parallel and max_attempts must be 1 or more")
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("give both the access key and the secret key, or neither")

    @classmethod
    def from_url(cls, url: str, env: Mapping[str, str] | None = None) -> ObjectStoreConfig:
        env = os.environ if env is None else env
        parts = urlsplit(url)
        if parts.scheme != "s3":
            raise ValueError(f"object store URL must start with s3://, not {url!r}")
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint", "region", "part_mb", "parallel"}
        if unknown:
            raise ValueError(f"unknown object store URL parameters: {', '.join(sorted(unknown))}")
        prefix = parts.path.strip("/")
        try:
            part_size = int(query.get("part_mb", "8")) * MiB
            parallel = int(query.get("parallel", "4"))
        except ValueError as exc:
            raise ValueError(f"object store URL {url!r}: {exc}") from None
        return cls(
            bucket=parts.netloc,
            prefix=prefix + "/" if prefix else "",
            endpoint=query.get("endpoint") or env.get("PANDASTACK_S3_ENDPOINT") or None,
            region=(query.get("region") or env.get("PANDASTACK_S3_REGION")
                    or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"),
            access_key=env.get("PANDASTACK_S3_ACCESS_KEY") or None,
            secret_key=env.get("PANDASTACK_S3_SECRET_KEY") or None,
            part_size=part_size,
            parallel=parallel,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ObjectStoreConfig | None:
        """The configured store, or None where PANDASTACK_OBJECT_STORE is not set."""
        env = os.environ if env is None else env
        url = env.get(OBJECT_STORE_ENV, "").strip()
        return cls.from_url(url, env) if url else None

    def describe(self) -> str:
        """The store for messages: never the credentials."""
        where = self.endpoint or f"AWS S3 ({self.region})"
        return f"object store s3://{self.bucket}/{self.prefix} at {where}"

    def part_size_for(self, size: int) -> int:
        """The part size for a file of `size` bytes: the configured one, or larger so that the
        file fits in MAX_PARTS parts (whole MiB)."""
        needed = -(-size // MAX_PARTS)
        return max(self.part_size, -(-needed // MiB) * MiB)
