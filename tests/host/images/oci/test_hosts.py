"""Registry hosts a tenant names: refused when any address they resolve to is not public,
unless the operator lists them (insecure registries, mirrors)."""

from __future__ import annotations

import pytest

from pandastack.host.images.oci.errors import RegistryUnavailable
from pandastack.host.images.oci.hosts import RegistryRefused, check_host, split_host_port
from pandastack.host.images.oci.settings import RegistrySettings

PUBLIC = "93.184.215.14"


def resolver(*addresses: str):  # type: ignore[no-untyped-def]
    asked: list[tuple[str, int]] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return list(addresses)

    resolve.asked = asked  # type: ignore[attr-defined]
    return resolve


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "100.64.0.1",
    "0.0.0.0", "::1", "fe80::1", "fec0::1", "fd00::5", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
    "64:ff9b::a00:1", "::127.0.0.1", "2002:7f00:1::1", "224.0.0.1", "fd00:ec2::254"])
def test_a_name_resolving_to_a_private_address_is_refused(address: str) -> None:
    with pytest.raises(RegistryRefused, match=r"^image x: registry host reg\.example is not a "
                                              r"public address") as caught:
        check_host("x", "reg.example:5000", RegistrySettings(), https=True,
                   resolve=resolver(PUBLIC, address))
    assert address not in str(caught.value)  # what it resolved to is not told


@pytest.mark.parametrize("netloc", ["127.0.0.1:5000", "[::1]:5000", "10.0.0.5", "localhost"])
def test_literal_and_loopback_hosts_are_refused(netloc: str) -> None:
    with pytest.raises(RegistryRefused, match="PANDASTACK_INSECURE_REGISTRIES"):
        check_host("x", netloc, RegistrySettings(), https=True)


def test_public_addresses_pass_and_the_port_is_resolved_with_the_host() -> None:
    resolve = resolver(PUBLIC, "2606:4700::6810:84e5")
    check_host("x", "reg.example:5000", RegistrySettings(), https=True, resolve=resolve)
    check_host("x", "reg.example", RegistrySettings(), https=True, resolve=resolve)
    check_host("x", "reg.example", RegistrySettings(), https=False, resolve=resolve)
    assert resolve.asked == [("reg.example", 5000), ("reg.example", 443),
                             ("reg.example", 80)]


def test_the_operators_insecure_registries_and_mirrors_are_not_checked() -> None:
    conf = RegistrySettings(insecure=frozenset({"127.0.0.1:5000"}),
                            mirrors={"registry-1.docker.io": "10.0.0.7:5000"})
    never = resolver()
    check_host("x", "127.0.0.1:5000", conf, https=False, resolve=never)
    check_host("x", "10.0.0.7:5000", conf, https=True, resolve=never)
    assert never.asked == []
    with pytest.raises(RegistryRefused):  # another port of the same host is not listed
        check_host("x", "127.0.0.1:5001", conf, https=False)


def test_a_name_that_does_not_resolve_is_unavailable() -> None:
    def nxdomain(host: str, port: int) -> list[str]:
        raise OSError(f"{host}: Name or service not known")

    with pytest.raises(RegistryUnavailable, match=r"registry host nowhere\.invalid does not "
                                                  "resolve"):
        check_host("x", "nowhere.invalid", RegistrySettings(), https=True, resolve=nxdomain)
    with pytest.raises(RegistryUnavailable, match="does not resolve"):
        check_host("x", "empty.invalid", RegistrySettings(), https=True, resolve=resolver())


@pytest.mark.parametrize(("netloc", "host", "port"), [
    ("reg.example", "reg.example", 443), ("reg.example:5000", "reg.example", 5000),
    ("[::1]:5000", "::1", 5000), ("[::1]", "::1", 443), ("1.2.3.4:80", "1.2.3.4", 80)])
def test_split_host_port(netloc: str, host: str, port: int) -> None:
    assert split_host_port(netloc, 443) == (host, port)


def test_a_connection_goes_to_the_address_checked_not_to_a_second_answer() -> None:
    # DNS rebinding: the name answers a public address to the check, then loopback. The
    # client's connection resolves once more, in its own backend, and refuses that answer
    # before any socket is opened (the name does not resolve on this machine: without the
    # pinned backend the system resolver would fail instead, RegistryUnavailable).
    from pandastack.host.images.oci.client import RegistryClient
    from pandastack.host.images.oci.reference import parse_reference

    answers = [[PUBLIC], ["127.0.0.1"]]

    def rebinding(host: str, port: int) -> list[str]:
        return answers.pop(0) if answers else ["127.0.0.1"]

    client = RegistryClient(parse_reference("rebind.invalid/team/app:1"), RegistrySettings(),
                            resolve=rebinding)
    with client, pytest.raises(RegistryRefused, match=r"rebind\.invalid is not a public"):
        client.resolve()
    assert answers == []  # the check and the connection each asked once
