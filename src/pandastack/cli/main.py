"""`pandastack` command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from rich.console import Console

from pandastack.host.config import HostConfig
from pandastack.host.errors import HostError
from pandastack.host.file_modes import restrict_umask
from pandastack.host.runtime import HostRuntime

from . import keys, sandbox, serve, template

console = Console(stderr=True)
# The commands that write the service's files (host/file_modes.py); the API clients' downloads
# keep the user's umask.
SERVICE_COMMANDS = ("setup", "serve", "keys")


def _progress(message: str) -> None:
    console.log(message)


async def _setup(args: argparse.Namespace) -> int:
    started = time.monotonic()
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
    sub = parser.add_subparsers(dest="command", required=True)
    setup = sub.add_parser("setup", help="build the guest image and the base template")
    setup.add_argument("--smoke", action="store_true", help="create one sandbox and run a command")
    serve.add_parser(sub)
    keys.add_parser(sub)
    sandbox.add_parser(sub)
    template.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command in SERVICE_COMMANDS:
        restrict_umask()
    try:
        if args.command == "setup":
            return asyncio.run(_setup(args))
        if args.command == "serve":
            return serve.run(args)
        if args.command == "keys":
            return keys.run(args)
        if args.command == "sandbox":
            return sandbox.run(args)
        if args.command == "template":
            return template.run(args)
    except (HostError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
