"""The session's servers that tests share (kept out of conftest so test modules can import
the types): one PostgreSQL (scripts/pg-cluster) and one S3 server (scripts/s3-server) for
the whole session. Each test still gets a database or key prefix of its own."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from tests.leftovers import owned_tmpdir

PG_CLUSTER = Path(__file__).resolve().parents[1] / "scripts" / "pg-cluster"


class Postgres:
    """The session's private PostgreSQL server (scripts/pg-cluster)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._admin = create_engine(dsn, isolation_level="AUTOCOMMIT", poolclass=NullPool)

    @contextmanager
    def database(self) -> Iterator[str]:
        """A new empty database for one test, dropped after it (with whatever still holds
        a connection to it)."""
        name = "t_" + secrets.token_hex(6)
        with self._admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        try:
            yield make_url(self.dsn).set(database=name).render_as_string(hide_password=False)
        finally:
            with self._admin.connect() as conn:
                conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))

    def close(self) -> None:
        self._admin.dispose()


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A PostgreSQL server started from Debian's binaries (`make deps` installs them) and
    removed after. Fails, never skips, when there is none: CI must run the store's suites on
    PostgreSQL."""
    path = owned_tmpdir("psp-")
    try:
        done = subprocess.run([str(PG_CLUSTER), "start", str(path)], capture_output=True,
                              text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "timed out after 180 s")
    if done.returncode != 0:
        subprocess.run([str(PG_CLUSTER), "stop", str(path)], capture_output=True, check=False)
        shutil.rmtree(path, ignore_errors=True)
        pytest.fail(f"cannot start PostgreSQL for the tests ({PG_CLUSTER.name} start): "
                    f"{done.stderr.strip()}", pytrace=False)
    server = Postgres(done.stdout.strip())
    try:
        yield server
    finally:
        server.close()
        subprocess.run([str(PG_CLUSTER), "stop", str(path)], capture_output=True, check=False)
