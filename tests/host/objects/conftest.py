from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pandastack.host.objects import ObjectStore, ObjectStoreConfig


@pytest.fixture
def store_config(s3_env: dict[str, str]) -> ObjectStoreConfig:
    """A prefix of its own for each test: keys are content hashes, and tests store the same
    bytes."""
    url = f"s3://{s3_env['PANDASTACK_S3_BUCKET']}/t-{uuid.uuid4().hex[:12]}"
    return ObjectStoreConfig.from_url(url, s3_env)


@pytest.fixture
async def store(store_config: ObjectStoreConfig, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    st = ObjectStore(store_config, tmp_path / "home" / "objects-cache")
    yield st
    await st.close()
    assert st.cache.temp_files() == [], "temp files left in the object cache"
