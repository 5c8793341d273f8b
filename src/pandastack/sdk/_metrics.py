"""The call builder of a sandbox's metrics (no I/O; `_base.py` holds the others)."""

from __future__ import annotations

from pandastack.guestproto.ops import (
    METRICS_MAX_WINDOW_MS,
    METRICS_MIN_WINDOW_MS,
    METRICS_WINDOW_MS,
)
from pandastack.sdk._base import Call, model_decoder, sandbox_path
from pandastack.sdk.errors import InvalidRequestError
from pandastack.wire.sandboxes import SandboxMetrics

DEFAULT_WINDOW_MS = METRICS_WINDOW_MS


def metrics_call(sandbox_id: str, window_ms: int) -> Call[SandboxMetrics]:
    if isinstance(window_ms, bool) or not isinstance(window_ms, int) or not (
            METRICS_MIN_WINDOW_MS <= window_ms <= METRICS_MAX_WINDOW_MS):
        raise InvalidRequestError(f"window_ms must be an integer from {METRICS_MIN_WINDOW_MS} "
                                  f"to {METRICS_MAX_WINDOW_MS}, not "
                                  f"{window_ms!r}", status=422, code="validation_error")
    return Call("GET", sandbox_path(sandbox_id, "metrics"), model_decoder(SandboxMetrics),
                params={"window_ms": str(window_ms)})
