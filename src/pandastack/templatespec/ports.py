"""Exposed ports in Docker's form, as an image config's ExposedPorts has them ("8080/tcp"):
what a template declares (a Dockerfile's `EXPOSE`, the builder's `expose`) and, merged with
its image's, lists in its info. Nothing is published by them (docs/templates.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_EXPOSED_PORTS = 1024
PROTOCOLS = ("tcp", "udp", "sctp")  # Docker's
_PORT_RE = re.compile(r"([0-9]{1,5})(?:-([0-9]{1,5}))?(?:/([A-Za-z]+))?")
_FORMS = "a port (8080), a port and protocol (53/udp: tcp, udp or sctp) or a range (8000-8010)"


def _parse(value: str) -> tuple[int, int, str]:
    found = _PORT_RE.fullmatch(value)
    if found is None:
        raise ValueError(f"{value!r} is not {_FORMS}")
    first = int(found.group(1))
    last = int(found.group(2) or first)
    protocol = (found.group(3) or "tcp").lower()  # Docker lowercases it too
    if protocol not in PROTOCOLS:
        raise ValueError(f"{value!r}: the protocol is tcp, udp or sctp, not {protocol!r}")
    if not (1 <= first <= 65535 and 1 <= last <= 65535):
        raise ValueError(f"{value!r}: a port is 1-65535")
    if last < first:
        raise ValueError(f"{value!r}: the range ends before it starts")
    if last - first >= MAX_EXPOSED_PORTS:
        raise ValueError(f"{value!r}: more than {MAX_EXPOSED_PORTS} ports")
    return first, last, protocol


def expose_ports(value: int | str) -> list[str]:
    """What Docker's `EXPOSE` makes of one word: `8080` and `8080/TCP` are `8080/tcp`, a
    range `8000-8002/udp` each of its ports."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a port")
    first, last, protocol = _parse(str(value))
    return [f"{port}/{protocol}" for port in range(first, last + 1)]


def exposed_port(value: str) -> str:
    """One port of a spec's `exposed_ports`, in Docker's form (`8080` becomes `8080/tcp`)."""
    ports = expose_ports(value)
    if len(ports) != 1:
        raise ValueError(f"{value!r}: one port, not a range")
    return ports[0]


def unique(ports: Iterable[str]) -> list[str]:
    """In the order first written, each once."""
    return list(dict.fromkeys(ports))


def merged_ports(*lists: Iterable[str]) -> list[str]:
    """The image's and the template's own, each once, sorted as Docker's JSON has the keys
    of ExposedPorts."""
    return sorted({port for ports in lists for port in ports})
