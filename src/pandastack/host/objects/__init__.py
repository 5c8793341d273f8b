"""The object store of a host: snapshot files, hibernation state, template artifacts and disk
layers under content-addressed keys in an S3-compatible store, fetched into a per-host cache
(ADR 0016). Configured by PANDASTACK_OBJECT_STORE (objects/config.py)."""

from typing import TYPE_CHECKING, Any

from pandastack.host.objects.cache import CACHE_DIR_NAME, ObjectCache, cache_dir_of
from pandastack.host.objects.config import OBJECT_STORE_ENV, ObjectStoreConfig
from pandastack.host.objects.keys import check_key, sha256_of_file

if TYPE_CHECKING:
    from pandastack.host.objects.store import MAX_RANGE, ObjectStats, ObjectStore


def __getattr__(name: str) -> Any:
    # The store loads boto3 (~170 ms): only for those that use it, not for whoever reads the
    # host's configuration.
    if name in ("MAX_RANGE", "ObjectStats", "ObjectStore"):
        from pandastack.host.objects import store

        return getattr(store, name)
    raise AttributeError(name)

__all__ = [
    "CACHE_DIR_NAME",
    "MAX_RANGE",
    "OBJECT_STORE_ENV",
    "ObjectCache",
    "ObjectStats",
    "ObjectStore",
    "ObjectStoreConfig",
    "cache_dir_of",
    "check_key",
    "sha256_of_file",
]
