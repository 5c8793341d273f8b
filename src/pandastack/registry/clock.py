"""The database's clock as UNIX seconds (float, as every time in the store), in SQL.

Hosts, heartbeats and leases are timed by the database only: hosts' clocks drift and an API
server's clock is no better, but every writer shares the one database. On PostgreSQL it is
CURRENT_TIMESTAMP, the start of the transaction (every statement of a heartbeat sees the same
time); SQLite has no time type and reads its own clock ('now', per statement, in ms)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class db_now(FunctionElement[float]):
    type = Float()
    name = "db_now"
    inherit_cache = True


@compiles(db_now)
def _now(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"
