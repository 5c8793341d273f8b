"""The host API's codec (hostport/host_api/codec.py): every error class of hostport.errors
travels by name and comes back as the same class with the same message and attributes; the
values the port returns cross as themselves (no second model of each)."""

from __future__ import annotations

import json

import pytest

from pandastack.hostport import errors as E
from pandastack.hostport.frames import FrameError
from pandastack.hostport.host_api.codec import (
    ErrorEnvelope,
    decode_error,
    dump_json,
    encode_error,
    error_classes,
    load_json,
    status_of,
)
from pandastack.hostport.host_api.models import (
    DirList,
    ExecDone,
    ExecRequest,
    HostVolumeList,
    Placement,
    port_value,
)
from pandastack.hostport.network import NetworkPolicy
from pandastack.hostport.protocols import SandboxPlacement
from pandastack.hostport.results import (
    BuildResult,
    CodeEvent,
    ExecResult,
    FileInfo,
    SnapshotInfo,
    SnapshotResult,
)
from pandastack.hostport.volumes import HostVolume


def sample(cls: type[Exception]) -> Exception:
    """An instance of `cls` with every attribute its constructor takes set."""
    if cls is E.GuestOSError:
        return E.GuestOSError("ENOENT", "no such file or directory", "/nope")
    if cls is E.SnapshotFailed:
        return E.SnapshotFailed("the disk is full", disk_switched=True, no_space=True)
    if cls is E.BuildFailed:
        return E.BuildFailed("step 2/3 RUN make failed", step=2, instruction="RUN make",
                             exit_code=2, output="make: *** [all] Error 1")
    if cls is E.HostMemoryExhausted:
        return E.HostMemoryExhausted(what="create sbx-1", available_mb=900, reserve_mb=1024,
                                     need_mb=40, held_mb=80, starting=2)
    return cls(f"a {cls.__name__} happened")


CLASSES = sorted(error_classes().items())


def test_every_host_error_class_is_named() -> None:
    named = set(error_classes())
    declared = {n for n, v in vars(E).items() if isinstance(v, type) and issubclass(v, E.HostError)}
    assert declared <= named and "ValueError" in named
    assert {"GuestOSError", "SnapshotFailed", "BuildFailed", "HostUnavailable"} <= named


@pytest.mark.parametrize(("name", "cls"), CLASSES, ids=[n for n, _ in CLASSES])
def test_error_round_trip(name: str, cls: type[Exception]) -> None:
    original = sample(cls)
    envelope = ErrorEnvelope.model_validate_json(encode_error(original).model_dump_json())
    assert envelope.error.type == name
    again = decode_error(envelope.error)
    assert type(again) is cls
    assert str(again) == str(original)
    assert vars(again) == vars(original)


def test_attributes_travel_nested_beside_the_message() -> None:
    body = encode_error(sample(E.GuestOSError)).model_dump()["error"]
    assert body == {"type": "GuestOSError",
                    "message": "ENOENT: no such file or directory (/nope)",
                    "attributes": {"errno_name": "ENOENT",
                                   "message": "no such file or directory", "path": "/nope"}}
    built = encode_error(sample(E.BuildFailed)).error.attributes
    assert built == {"step": 2, "instruction": "RUN make", "exit_code": 2,
                     "output": "make: *** [all] Error 1"}


def test_subclasses_and_strangers() -> None:
    frame = encode_error(FrameError("bad frame")).error  # a HostError defined elsewhere
    assert (frame.type, frame.message) == ("HostError", "bad frame")
    bug = encode_error(KeyError("x")).error
    assert bug.type == "HostError" and "KeyError" in bug.message
    assert status_of(KeyError("x")) == 500
    unknown = decode_error(ErrorEnvelope.model_validate(
        {"error": {"type": "FromTheFuture", "message": "m"}}).error)
    assert type(unknown) is E.HostError and str(unknown) == "m"
    value = decode_error(encode_error(ValueError("vcpus must be 1-8")).error)
    assert type(value) is ValueError and str(value) == "vcpus must be 1-8"


def test_statuses() -> None:
    assert status_of(E.SandboxNotFound("x")) == 404
    assert status_of(E.TemplateNotFound("x")) == 404  # nearer than SetupError's 500
    assert status_of(E.SandboxStateError("x")) == 409
    assert status_of(ValueError("x")) == 400
    assert status_of(sample(E.GuestOSError)) == 422
    assert status_of(E.AgentConnectionError("x")) == 502
    assert status_of(E.HostUnavailable("x")) == 503
    assert status_of(sample(E.HostMemoryExhausted)) == 503  # a HostExhausted
    assert status_of(E.VMMError("x")) == 500


def test_values_cross_as_themselves() -> None:
    info = SnapshotInfo(id="snap-1", name="n", source="sbx-1", template="base",
                        template_path="/t", vcpus=2, memory_mb=1024, disk_bytes=10,
                        layers=("a", "b"), created_at=1.5, state_bytes=3, internal=True,
                        size_bytes=9, transient=True, volumes=({"volume_id": "v"},))
    result = SnapshotResult(info=info, pause_ms=2.5, method="background")
    assert load_json(SnapshotResult, dump_json(result)) == result
    assert json.loads(dump_json(result))["info"]["layers"] == ["a", "b"]
    fi = FileInfo(name="f", path="/f", type="file", size=1, mode=0o644, mtime=2.0)
    assert load_json(FileInfo, dump_json(fi)) == fi
    event = CodeEvent("result", data={"text/plain": "42"}, is_main_result=True,
                      execution_count=3)
    assert load_json(CodeEvent, dump_json(event)) == event
    build = BuildResult(snapshot_id="snap-2", env={"A": "1"}, workdir="/w", user=None,
                        start=None, steps_total=3, steps_cached=1, seconds=4.0)
    assert load_json(BuildResult, dump_json(build)) == build


def test_a_volume_crosses_without_the_pool_s_host_id() -> None:
    """`host_id` is a pool's, not a host's: older clients refuse a field they do not know."""
    volume = HostVolume("vol-1", 64, 1.0, None, ("sbx-1",), host_id="h-1")
    sent = json.loads(dump_json(HostVolumeList(volumes=[volume])))
    assert sent == {"volumes": [{"id": "vol-1", "size_mb": 64, "created_at": 1.0,
                                 "source": None, "attached_to": ["sbx-1"]}]}
    assert load_json(HostVolumeList, json.dumps(sent)).volumes == [
        HostVolume("vol-1", 64, 1.0, None, ("sbx-1",))]


def test_conversions() -> None:
    placement = SandboxPlacement(NetworkPolicy(False, ("1.2.3.4/32",), ("example.com",)),
                                 "10.200.0.2")
    wire = Placement.model_validate(placement, from_attributes=True)
    assert port_value(load_json(Placement, dump_json(wire))) == placement
    done = ExecResult(exit_code=3, stdout=b"o", stderr=b"e", duration_ms=1.0, timed_out=False,
                      signal=None, truncated=False)
    assert ExecDone.of(done).value(b"o", b"e", truncated=False) == done
    assert ExecDone.of(done).value(b"o", b"e", truncated=True).truncated


def test_bytes_are_base64_in_json_and_bytes_in_python() -> None:
    raw = b"\x00piped\xff"
    request = ExecRequest(cmd=["cat"], stdin=raw)
    assert request.stdin == raw  # given as bytes, kept as they are
    text = request.model_dump_json()
    assert '"stdin":"AHBpcGVk/w=="' in text
    assert ExecRequest.model_validate_json(text).stdin == raw
    with pytest.raises(ValueError, match="base64"):
        ExecRequest.model_validate_json('{"cmd": "cat", "stdin": "!!"}')


def test_guest_strings_with_undecodable_bytes_cross_unchanged() -> None:
    """A guest file name with a byte that is not UTF-8 arrives as a lone surrogate; pydantic's
    JSON (and Starlette's UTF-8) refuse it, the host API's JSON escapes it."""
    name = b"caf\xff.txt".decode("utf-8", "surrogateescape")
    listed = DirList(entries=[FileInfo(name, "/w/" + name, "file", 1, 0o644, 0.0)])
    payload = dump_json(listed)
    assert payload.isascii()
    back = load_json(DirList, payload)
    assert back.entries[0].name == name and back.entries[0].path == "/w/" + name
