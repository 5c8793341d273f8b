"""What a tenant's `allow_out` may open, through the API over the in-memory runtime: an entry
reaching into the always-denied ranges (private, loopback, link-local/metadata, CGNAT,
multicast...) is refused with 422 naming it, unless the operator's list
(`PANDASTACK_NETWORK_OPERATOR_ALLOW`) holds that part. Nothing is sent anywhere."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from pandastack.server.settings import Settings
from tests.server.conftest import Api, assert_envelope, make_settings, running_app
from tests.server.fakes import FakeRuntime

DENIED = ["169.254.169.254/32", "0.0.0.0/0", "10.0.0.0/8", "127.0.0.1/32", "127.0.0.1",
          "192.168.1.0/24", "172.16.5.4/32", "100.64.0.0/10", "224.0.0.0/4", "1.0.0.0/1",
          "96.0.0.0/3"]
PUBLIC = ["203.0.113.0/24", "1.1.1.1", "pypi.org", "*.example.com"]

ApiOpener = Callable[..., AbstractAsyncContextManager[Api]]


@pytest.fixture
def open_api(tmp_path: Path) -> ApiOpener:
    def open_(**settings: object) -> AbstractAsyncContextManager[Api]:
        runtime = FakeRuntime(tmp_path / "sandboxes")
        return running_app(make_settings(tmp_path, **settings), runtime)
    return open_


@pytest.fixture
async def api(open_api: ApiOpener) -> AsyncIterator[Api]:
    async with open_api() as a:
        yield a


async def refused(api: Api, entry: str) -> None:
    """Both ways of setting a policy answer 422 with a message naming `entry`."""
    c = api.client
    r = await c.post("/v1/sandboxes", json={"network": {"internet": False,
                                                        "allow_out": ["pypi.org", entry]}})
    assert_envelope(r, 422, "validation_error")
    assert repr(entry) in r.json()["error"]["message"], r.json()
    r = await c.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for method in (c.put, c.patch):
        r = await method(f"/v1/sandboxes/{sid}/network", json={"allow_out": [entry]})
        assert_envelope(r, 422, "validation_error")
        assert repr(entry) in r.json()["error"]["message"], r.json()
    # Nothing changed.
    assert (await c.get(f"/v1/sandboxes/{sid}/network")).json()["allow_out"] == []


@pytest.mark.parametrize("entry", DENIED)
async def test_allow_out_into_the_denied_set_is_refused(api: Api, entry: str) -> None:
    await refused(api, entry)


async def test_public_entries_and_deny_out_are_accepted(api: Api) -> None:
    c = api.client
    r = await c.post("/v1/sandboxes", json={"network": {"internet": False, "allow_out": PUBLIC,
                                                        "deny_out": DENIED}})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = await c.get(f"/v1/sandboxes/{sid}/network")
    assert r.json() == {"internet": False, "allow_out": PUBLIC, "deny_out": DENIED}


async def test_the_refusal_says_what_to_do(api: Api) -> None:
    r = await api.client.post("/v1/sandboxes",
                              json={"network": {"allow_out": ["0.0.0.0/0"]}})
    message = r.json()["error"]["message"]
    assert "always-denied" in message and "internet" in message, message


async def test_the_operator_list_opens_what_it_holds_and_nothing_more(
        open_api: ApiOpener) -> None:
    async with open_api(network_operator_allow=("10.1.0.0/16", "169.254.169.254/32")) as api:
        c = api.client
        for entry in ("10.1.0.0/16", "10.1.2.0/24", "10.1.2.3", "169.254.169.254/32"):
            r = await c.post("/v1/sandboxes", json={"network": {"allow_out": [entry]}})
            assert r.status_code == 201, (entry, r.text)
            sid = r.json()["id"]
            r = await c.put(f"/v1/sandboxes/{sid}/network", json={"allow_out": [entry]})
            assert r.status_code == 200 and r.json()["allow_out"] == [entry], r.text
        # Partly outside the operator's list: still refused.
        for entry in ("10.0.0.0/8", "10.1.0.0/15", "169.254.0.0/16", "0.0.0.0/0",
                      "127.0.0.1/32"):
            await refused(api, entry)


def test_the_operator_list_is_read_from_the_environment_and_checked() -> None:
    env = {"PANDASTACK_NETWORK_OPERATOR_ALLOW": " 10.1.0.0/16, 192.168.7.9 ,"}
    assert Settings.from_env(env).network_operator_allow == ("10.1.0.0/16", "192.168.7.9/32")
    assert Settings.from_env({}).network_operator_allow == ()
    for bad in ("10.1.0.0/33", "example.com", "fd00::/8"):
        with pytest.raises(ValueError, match="PANDASTACK_NETWORK_OPERATOR_ALLOW"):
            Settings.from_env({"PANDASTACK_NETWORK_OPERATOR_ALLOW": bad})
    with pytest.raises(ValueError):
        Settings(network_operator_allow=("nonsense",))
