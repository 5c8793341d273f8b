"""`pandastack doctor`: whether this host can run pandastack, and how to fix what it lacks.

Each check (the table below) says ok, warn or fail, and for a warn or a fail what to do. The
exit status is 1 when a check fails (the host cannot serve), 0 otherwise. It reads the
configuration as `serve` and `agent` do (PANDASTACK_* variables; under systemd the env file
/etc/pandastack/pandastack.env, which `--env-file` reads here too) and changes nothing but the
accelerator's cached verdict, which a probe boot that contradicts it drops.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import doctor_host as hostchk
from . import doctor_secrets as keychk
from . import doctor_services as svc
from .doctor_model import ROLES, CheckSpec, Context, Finding, Role, as_json, exit_status, run_checks
from .env_file import add_env_file_option, load_env_file

# In order: the settings first (the others read them), the accelerator before the templates
# (their key holds it).
CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("settings", svc.check_settings),
    CheckSpec("accelerator", hostchk.check_accelerator, ("agent",)),
    CheckSpec("qemu", hostchk.check_qemu, ("agent",)),
    CheckSpec("cgroups", hostchk.check_cgroups, ("agent",)),
    CheckSpec("nftables", hostchk.check_nftables, ("agent",)),
    CheckSpec("tun", hostchk.check_tun, ("agent",)),
    CheckSpec("netns", hostchk.check_netns, ("agent",)),
    CheckSpec("userfaultfd", hostchk.check_userfaultfd, ("agent",)),
    CheckSpec("huge pages", hostchk.check_huge_pages, ("agent",)),
    CheckSpec("disk", hostchk.check_disk, ("agent",)),
    CheckSpec("clock", hostchk.check_clock),
    CheckSpec("ports", svc.check_ports, ("serve",)),
    CheckSpec("database", svc.check_database, ("serve",)),
    CheckSpec(keychk.CHECK, keychk.check_encryption_key, ("serve",)),
    CheckSpec("object store", svc.check_object_store),
    CheckSpec("guest image", svc.check_images, ("agent",)),
    CheckSpec("templates", svc.check_templates, ("agent",)),
)
STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check that this host can run pandastack, and say how to "
                                      "fix what it lacks")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("--quick", action="store_true",
                   help="skip the probe boot of the guest kernel under KVM (use the cached "
                        "verdict)")
    p.add_argument("--role", choices=[*ROLES, "all"], default="all",
                   help="check only what `serve` (an API server of a cluster) or `agent` (a "
                        "host of VMs) needs (default: all, as `serve` with its host in-process)")
    add_env_file_option(p)


def diagnose(roles: Sequence[Role] = ROLES, *, quick: bool = False) -> list[Finding]:
    return run_checks(CHECKS, Context(settings=None, host=None, quick=quick), roles)


def _render(findings: Sequence[Finding]) -> None:
    """One line per check, its fix indented under it: readable in a narrow terminal and in
    a log alike."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(highlight=False)
    width = max(len(f.check) for f in findings)
    for f in findings:
        style = STATUS_STYLE[f.status]
        console.print(f"[{style}]{f.status:>4}[/{style}]  {f.check:<{width}}  "
                      f"{escape(f.summary)}", soft_wrap=True)
        if f.fix:
            console.print(f"{'':>4}  {'':<{width}}  fix: {escape(f.fix)}", soft_wrap=True)
    failed = [f.check for f in findings if f.status == "fail"]
    if failed:
        console.print(f"[red]this host cannot serve:[/red] {', '.join(failed)} failed")
    else:
        console.print("[green]this host can serve[/green]"
                      + (" (with warnings)" if any(f.status == "warn" for f in findings) else ""))


def run(args: argparse.Namespace) -> int:
    load_env_file(args.env_file)
    roles: tuple[Role, ...] = ROLES if args.role == "all" else (args.role,)
    findings = diagnose(roles, quick=args.quick)
    if args.json:
        json.dump(as_json(findings), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _render(findings)
    return exit_status(findings)
