"""The call builder of a sandbox's metrics (no I/O; `_base.py` holds the others)."""

from __future__ import annotations

from pandastack.sdk._base import Call, model_decoder, sandbox_path
from pandastack.sdk.errors import InvalidRequestError
from pandastack.wire.sandboxes import SandboxMetrics

DEFAULT_WINDOW_MS = 200


def metrics_call(sandbox_id: str, window_ms: int) -> Call[SandboxMetrics]:
    if isinstance(window_ms, bool) or not isinstance(window_ms, int) or not (
            10 <= window_ms <= 2000):
        raise InvalidRequestError(f"window_ms must be an integer from 10 to 2000, not "
                                  f"{window_ms!r}", status=422, code="validation_error")
    return Call("GET", sandbox_path(sandbox_id, "metrics"), model_decoder(SandboxMetrics),
                params={"window_ms": str(window_ms)})
