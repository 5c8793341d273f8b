"""E2B's code interpreter (sandbox port 49999) over ours: `POST /execute` and `/contexts`.

E2B's `e2b-code-interpreter` SDK posts `{code, context_id | language, env_vars}` to
`/execute` and reads newline-delimited JSON back, one object a line, as the run produces
them: `stdout` / `stderr` (`text`, `timestamp`), `result` (a MIME bundle spread over named
fields: `text`, `html`, `png`, ..., the other types in `extra`), `error` (`name`, `value`,
`traceback`), `number_of_executions`, then `end_of_execution`; a run that could not finish
ends with an `error` named UnexpectedEndOfExecution and `unexpected_end_of_execution`.
`/contexts` creates, lists, restarts and deletes code contexts.

Everything here is our code interpreter (the sandbox port's `run_code` and context
operations, as `routes/code.py` calls them): its events translated (`translate.py`), nothing
added in the guest; `routes.py` serves them.
"""

from __future__ import annotations

from .routes import ROUTES

__all__ = ["ROUTES"]
