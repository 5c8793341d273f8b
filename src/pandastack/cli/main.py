"""`pandastack` command line."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from typing import Protocol, cast

from rich.console import Console
from rich.markup import escape


class Command(Protocol):
    """A command: a module of this package named as the command, with these two."""

    def add_parser(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# Each command's module, in the order `pandastack --help` lists them (after `setup`, which is
# here). Only the module of the command being run is imported (all of them for --help): a
# command's imports are its own, so `serve` does not load the SDK nor `sandbox` the server.
COMMAND_MODULES: dict[str, str] = {
    name: name for name in ("serve", "agent", "keys", "sandbox", "snapshot", "files",
                            "template", "volume", "hosts", "usage", "teams", "events",
                            "webhook", "registry", "mcp", "doctor", "backup", "restore")}
COMMAND_MODULES["install-units"] = "doctor_units"
LOADED_COMMANDS: dict[str, Command] = {}


def load_command(name: str) -> Command:
    if name not in LOADED_COMMANDS:
        module = importlib.import_module(f"{__package__}.{COMMAND_MODULES[name]}")
        LOADED_COMMANDS[name] = cast(Command, module)
    return LOADED_COMMANDS[name]


def _chosen_commands(argv: list[str]) -> list[str]:
    """The commands whose parsers `argv` needs: the one it names, else (no command, --help,
    a typo) every one, so that argparse lists them or says what is wrong."""
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    if chosen == "setup" or (chosen is None and "--version" in argv):
        return []
    return [chosen] if chosen in COMMAND_MODULES else list(COMMAND_MODULES)


console = Console(stderr=True)
# The commands that write the service's files (host/file_modes.py); the API clients' downloads
# keep the user's umask. They run the server or the host, so they need the `server` extra; the
# client commands (`sandbox`, `template`, `hosts`) need only the SDK and never import server or
# host.
SERVICE_COMMANDS = ("setup", "serve", "keys", "agent", "doctor", "backup", "restore")
# The top-level modules of the `server` extra (pyproject.toml).
SERVER_EXTRA = "pandastack[server]"
SERVER_EXTRA_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "qemu.qmp", "websockets")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a missing parent package (`qemu` of `qemu.qmp`)
        return False


def missing_server_extra() -> list[str]:
    """The server extra's modules that are not installed (none after `pip install
    'pandastack[server]'`)."""
    return [m for m in SERVER_EXTRA_MODULES if not _installed(m)]


def installed_version() -> str:
    """The version of the code that runs (src/pandastack/_version.py, which a wheel's metadata
    is made from): an editable install's metadata keeps the version it was installed at."""
    from pandastack._version import __version__

    return __version__


def _progress(message: str) -> None:
    console.log(message)


def _ensure_encryption_key() -> None:
    """The operator's key that seals team secrets in the database (registry passwords), made
    once: a second setup keeps it, since a new key would leave every stored one unreadable."""
    from pandastack.server.registries.sealing import make_key_file
    from pandastack.server.settings import Settings

    path = Settings.from_env().encryption_key_path
    if make_key_file(path):
        console.log(f"made the encryption key of team secrets at {path} (mode 0600): keep a "
                    "copy with the database's backups; every API server needs this file")
    else:
        console.log(f"encryption key of team secrets: {path} (kept)")


async def _setup(args: argparse.Namespace) -> int:
    from pandastack.host.config import HostConfig
    from pandastack.host.runtime import HostRuntime
    from pandastack.host.templates.builtin import BUILTIN_TEMPLATES

    unknown = [name for name in args.template if name not in BUILTIN_TEMPLATES]
    if unknown:  # before any build: a typo must not cost the minutes of the others first
        raise ValueError(f"unknown template(s) {', '.join(map(repr, unknown))}; built-in: "
                         f"{', '.join(sorted(BUILTIN_TEMPLATES))}")
    started = time.monotonic()
    _ensure_encryption_key()
    runtime = HostRuntime(HostConfig.from_env(), progress=_progress)
    with console.status("preparing host: guest image, accelerator, base template"):
        await runtime.prepare()
        template = await runtime.ensure_template("base")
    console.log(f"accelerator: {runtime.driver.accel}; base template at {template.path}")
    # The template the seed article's example uses: built ahead so a first create is fast.
    with console.status("preparing the code-interpreter template (numpy, pandas, pyarrow, "
                        "matplotlib)"):
        interp = await runtime.ensure_template("code-interpreter")
    console.log(f"code-interpreter template at {interp.path}")
    for name in dict.fromkeys(args.template):
        t0 = time.monotonic()
        with console.status(f"preparing the {name} template"):
            extra = await runtime.ensure_template(name)
        console.log(f"{name} template at {extra.path} ({time.monotonic() - t0:.1f}s)")
    if args.smoke:
        async with runtime:
            sbx = await runtime.create()
            result = await sbx.exec("python -c 'print(6*7)'")
            await runtime.kill(sbx.id)
        console.log(f"smoke test: exit {result.exit_code}, stdout {result.stdout!r}")
    console.log(f"setup done in {time.monotonic() - started:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pandastack")
    parser.add_argument("--version", action="version", version=f"pandastack {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help="build the guest image and the base template")
    setup.add_argument("--smoke", action="store_true", help="create one sandbox and run a command")
    setup.add_argument("--template", action="append", default=[], metavar="NAME",
                       help="also build this built-in template ahead (repeatable), so that its "
                            "first create does not wait for its image")
    argv = sys.argv[1:] if argv is None else argv
    for name in _chosen_commands(argv):
        load_command(name).add_parser(sub)
    args = parser.parse_args(argv)
    errors: tuple[type[Exception], ...] = (ValueError,)
    # `keys` goes through the API unless told to use the database (`--db`).
    if args.command in SERVICE_COMMANDS and (args.command != "keys" or args.db):
        missing = missing_server_extra()
        if missing:
            console.print(f"[red]error:[/red] pandastack {args.command} needs the server extra: "
                          f"pip install '{escape(SERVER_EXTRA)}' (missing: {', '.join(missing)})",
                          soft_wrap=True)
            return 1
        from pandastack.host.file_modes import restrict_umask
        from pandastack.hostport.errors import HostError

        restrict_umask()
        errors = (HostError, ValueError)
    try:
        if args.command == "setup":
            return asyncio.run(_setup(args))
        if args.command in COMMAND_MODULES:
            return load_command(args.command).run(args)
    except errors as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
