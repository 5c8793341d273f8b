"""Fixtures of the cluster tests here: a database of its own per test (`pg_dsn`, from
tests/registry) and the session's S3 server with its keys in the agents' environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.registry.conftest import pg_dsn

__all__ = ["pg_dsn"]


@pytest.fixture(scope="module")
def s3_env(s3_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The session's S3 server (tests/conftest.py), its keys in the agents' environment."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("PANDASTACK_S3_ACCESS_KEY", "PANDASTACK_S3_SECRET_KEY"):
            mp.setenv(name, s3_env[name])
        yield s3_env
