"""What `pandastack doctor` reports: one finding per check, and the verdict of them all.

Kept apart from the checks so that the verdict and the rendering are tested without a host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pandastack.host.config import HostConfig
    from pandastack.server.settings import Settings

Status = Literal["ok", "warn", "fail"]
# Which process a check matters to: an API server of a cluster runs no VMs, and an agent
# serves no API port (`doctor --role`).
Role = Literal["serve", "agent"]
ROLES: tuple[Role, ...] = ("serve", "agent")


@dataclass(frozen=True)
class Finding:
    """One check's verdict. `fix` says what to do about a warn or a fail ("" when ok)."""

    check: str
    status: Status
    summary: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status != "ok" and not self.fix:
            raise ValueError(f"check {self.check}: a {self.status} must say how to fix it")


@dataclass
class Context:
    """What the checks read: the configuration as `serve` and `agent` would read it, and what
    earlier checks found that later ones need (the accelerator, for the templates' key)."""

    settings: Settings | None
    host: HostConfig | None
    quick: bool = False
    # Set by the accelerator check: "kvm" or "tcg", None where it could not tell.
    accel: str | None = None
    notes: dict[str, str] = field(default_factory=dict)


Check = Callable[[Context], Finding]


def unconfigured(check: str) -> Finding:
    """The finding of a check that needs the settings when they did not load."""
    return Finding(check, "fail", "not checked: the settings do not load",
                   "fix the settings (see the settings check)")


@dataclass(frozen=True)
class CheckSpec:
    name: str
    run: Check
    roles: tuple[Role, ...] = ROLES


def run_checks(specs: Sequence[CheckSpec], context: Context,
               roles: Sequence[Role] = ROLES) -> list[Finding]:
    """Every check that matters to one of `roles`, in order. A check that raises is a fail
    of its own (with the error), never the end of the report."""
    findings: list[Finding] = []
    for spec in specs:
        if not set(spec.roles) & set(roles):
            continue
        try:
            findings.append(spec.run(context))
        except Exception as exc:  # the report must go on: a broken check is a finding
            findings.append(Finding(spec.name, "fail", f"the check itself failed: {exc}",
                                    "report this as a bug of `pandastack doctor`"))
    return findings


def can_serve(findings: Sequence[Finding]) -> bool:
    """A host can serve with warnings (slower, less isolated, fewer features), not with a
    fail."""
    return all(f.status != "fail" for f in findings)


def exit_status(findings: Sequence[Finding]) -> int:
    return 0 if can_serve(findings) else 1


def as_json(findings: Sequence[Finding]) -> dict[str, object]:
    counts = {status: sum(f.status == status for f in findings)
              for status in ("ok", "warn", "fail")}
    return {"can_serve": can_serve(findings), "counts": counts,
            "checks": [asdict(f) for f in findings]}
