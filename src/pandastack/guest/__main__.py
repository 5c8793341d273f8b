"""Entry point: ``python3 -m pandastack_guest --guest`` (in the VM) or ``--fd N`` (tests)."""

from __future__ import annotations

import argparse
import logging
import sys

from . import __version__, volumes
from .agent import Agent
from .channel import PORT_NAME, Channel, SocketChannel, open_port
from .code import SOCKET_PATH


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pandastack_guest", description="pandastack guest agent")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--guest",
        action="store_true",
        help="run inside the VM: use the virtio-serial port, apply init, use cgroups",
    )
    mode.add_argument(
        "--fd",
        type=int,
        metavar="N",
        help="test mode: talk over the already-open socket N; never touches the machine",
    )
    p.add_argument("--port-name", default=PORT_NAME, help="virtio-serial port name (--guest)")
    p.add_argument("--port-wait", type=float, default=10.0, help="seconds to wait for the port")
    p.add_argument("--code-socket", default=SOCKET_PATH,
                   help="unix socket of the code interpreter (the `code` op)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="pandastack-agent[%(process)d] %(levelname)s %(message)s",
    )
    log = logging.getLogger("pandastack_guest")
    chan: Channel
    if args.guest:
        # Once, at the template's cold boot: every clone restored from it has the answer in
        # its memory (reading a disk's serial is an I/O request to the VMM, ~20 ms each
        # under TCG, paid at every volume mount otherwise).
        volumes.learn_disks()
        try:
            chan = open_port(args.port_name, args.port_wait)
        except OSError as e:
            log.error("%s", e)
            return 1
    else:
        chan = SocketChannel(args.fd)
    log.info("agent %s starting (%s)", __version__, "guest" if args.guest else "test mode")
    agent = Agent(chan, guest=bool(args.guest), code_socket=args.code_socket)
    try:
        rc = agent.run()
    except KeyboardInterrupt:
        rc = 130
    if not args.guest:
        agent.procs.kill_all()  # test mode: leave nothing behind on the developer's host
    return rc


if __name__ == "__main__":
    sys.exit(main())
