"""Config resolution: argument > environment > config file, per setting."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from pandastack import Client, ConfigError, Sandbox
from pandastack.sdk.config import default_config_path, resolve_config


def write_config(path: Path, **values: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values))
    return path


@pytest.fixture
def cfg_file(tmp_path: Path) -> Path:
    return default_config_path()  # under the isolated XDG_CONFIG_HOME


def test_default_path_follows_xdg_then_home(tmp_path: Path) -> None:
    assert default_config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/pandastack/config.json")
    assert default_config_path({}) == Path.home() / ".config" / "pandastack" / "config.json"


def test_config_file_is_the_fallback(cfg_file: Path) -> None:
    write_config(cfg_file, api_url="http://file:1/", api_key="file-key")
    config = resolve_config()
    assert (config.api_url, config.api_key) == ("http://file:1", "file-key")


def test_env_beats_file(cfg_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(cfg_file, api_url="http://file:1", api_key="file-key")
    monkeypatch.setenv("PANDASTACK_API", "http://env:2")
    monkeypatch.setenv("PANDASTACK_API_KEY", "env-key")
    config = resolve_config()
    assert (config.api_url, config.api_key) == ("http://env:2", "env-key")


def test_arguments_beat_env(cfg_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PANDASTACK_API", "http://env:2")
    monkeypatch.setenv("PANDASTACK_API_KEY", "env-key")
    config = resolve_config("http://arg:3", "arg-key")
    assert (config.api_url, config.api_key) == ("http://arg:3", "arg-key")


def test_each_setting_resolves_on_its_own(cfg_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(cfg_file, api_url="http://file:1", api_key="file-key")
    monkeypatch.setenv("PANDASTACK_API", "http://env:2")
    assert resolve_config().api_key == "file-key"
    assert resolve_config().api_url == "http://env:2"
    assert resolve_config(api_key="arg-key").api_url == "http://env:2"


def test_empty_env_counts_as_unset(cfg_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(cfg_file, api_url="http://file:1", api_key="file-key")
    monkeypatch.setenv("PANDASTACK_API", "")
    assert resolve_config().api_url == "http://file:1"


def test_missing_url_names_every_source() -> None:
    with pytest.raises(ConfigError, match=r"PANDASTACK_API\b.*config\.json"):
        resolve_config(api_key="k")


def test_missing_key_names_every_source() -> None:
    with pytest.raises(ConfigError, match=r"PANDASTACK_API_KEY.*config\.json"):
        resolve_config(api_url="http://x")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_broken_config_file(cfg_file: Path, content: str) -> None:
    cfg_file.parent.mkdir(parents=True)
    cfg_file.write_text(content)
    with pytest.raises(ConfigError, match="config file"):
        resolve_config()


def test_file_is_not_read_when_arguments_suffice(cfg_file: Path) -> None:
    cfg_file.parent.mkdir(parents=True)
    cfg_file.write_text("{not json")
    assert resolve_config("http://a", "k").api_url == "http://a"


def test_url_must_be_http() -> None:
    with pytest.raises(ConfigError, match="http"):
        resolve_config("pandastack.example:8080", "k")


def test_key_is_not_in_repr() -> None:
    assert "sekrit" not in repr(resolve_config("http://a", "sekrit"))


def test_timeout_number_becomes_httpx_timeout() -> None:
    assert resolve_config("http://a", "k", timeout=5).timeout == httpx.Timeout(5)


def test_unconfigured_sdk_fails_before_any_request() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request may be sent")

    with pytest.raises(ConfigError):
        Sandbox.create(transport=httpx.MockTransport(refuse))
    with pytest.raises(ConfigError):
        Client(transport=httpx.MockTransport(refuse))


def test_config_file_configures_the_sdk(cfg_file: Path) -> None:
    write_config(cfg_file, api_url="http://file.test", api_key="file-key")
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"sandboxes": []})

    assert Sandbox.list(transport=httpx.MockTransport(handle)) == []
    assert str(seen[0].url) == "http://file.test/v1/sandboxes?include_ended=false"
    assert seen[0].headers["authorization"] == "Bearer file-key"


def test_ca_bundle_resolves_like_the_rest(cfg_file: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    arg, env, file = (tmp_path / f"{n}.pem" for n in ("arg", "env", "file"))
    for pem in (arg, env, file):
        pem.write_text("-")
    write_config(cfg_file, api_url="https://file.test", api_key="k", ca_bundle=str(file))
    assert resolve_config().ca_bundle == str(file)
    monkeypatch.setenv("PANDASTACK_CA_BUNDLE", str(env))
    assert resolve_config().ca_bundle == str(env)
    assert resolve_config(ca_bundle=arg).ca_bundle == str(arg)
    monkeypatch.delenv("PANDASTACK_CA_BUNDLE")
    # The file's bundle belongs to the file's server, not to one given as arguments.
    assert resolve_config("https://a", "k").ca_bundle is None
    with pytest.raises(ConfigError, match="not a file"):
        resolve_config("https://a", "k", ca_bundle=tmp_path / "missing.pem")
