"""A build FROM an image starts from its config's Env, WorkingDir and User; bases written
as images are told from templates and snapshots the way the control plane hands them over;
its Entrypoint and Cmd make one start command when the spec asks for it."""

from __future__ import annotations

import pytest

from pandastack.host.images.oci.guest_image import ImageDefaults
from pandastack.host.templates.builds import image_start, initial_state
from pandastack.host.templates.image_base import ImageBase, is_image
from pandastack.host.templates.steps import unknown_user, user_of
from pandastack.hostport.errors import BuildFailed


def base(env: dict[str, str], workdir: str | None, user: str | None) -> ImageBase:
    return ImageBase("oci-x", "key", ImageDefaults(env=env, working_dir=workdir, user=user))


def test_the_image_config_is_where_the_steps_start() -> None:
    state = initial_state(base({"PATH": "/bin", "A": "1"}, "/app", "app"))
    assert (state.env, state.workdir, state.user) == ({"PATH": "/bin", "A": "1"}, "/app", "app")


@pytest.mark.parametrize("user", [None, "", "root", "0", "0:0", "root:root"])
def test_root_in_any_spelling_runs_steps_as_they_run_on_templates(user: str | None) -> None:
    assert initial_state(base({}, None, user)).user is None


def test_a_group_is_kept_for_the_agent() -> None:
    assert initial_state(base({}, None, "app:staff")).user == "app:staff"


@pytest.mark.parametrize(("spec", "user"), [
    ("app", "app"), ("1000", "1000"), ("app:staff", "app:staff"), ("1000:1000", "1000:1000"),
    ("1000:", "1000"), (" 65532:65532 ", "65532:65532"), (":1000", "0:1000"),
    ("0:1000", "0:1000"), ("root:wheel", "root:wheel"), ("root:0", None), (None, None)])
def test_the_user_spec_goes_to_the_agent_as_docker_reads_it(spec: str | None,
                                                            user: str | None) -> None:
    # What the agent's exec-as-user is given: it resolves the user and the group from the
    # image's /etc/passwd and /etc/group (no runuser, which refuses a uid and busybox
    # images lack); root with root's group is no user at all, as on templates.
    assert user_of(spec) == user


@pytest.mark.parametrize(("user", "error", "why"), [
    ("app:staff", "no such group: 'staff'", "no group 'staff' in the base's /etc/group"),
    ("app", "no such user: 'app'", "no user 'app' in the base's /etc/passwd"),
    ("app:staff", "no such user: 'app:staff'", "guest agent predates USER user:group"),
    (None, "no such user: 'x'", None), ("app", "ENOENT: /work", None)])
def test_unknown_users_and_groups_are_named(user: str | None, error: str,
                                            why: str | None) -> None:
    got = unknown_user(user, error)
    assert got is None if why is None else got is not None and why in got


def test_without_an_image_nothing_is_set() -> None:
    state = initial_state(None)
    assert (state.env, state.workdir, state.user) == ({}, None, None)


@pytest.mark.parametrize(("name", "image"), [
    ("base", False), ("node", False), ("snapshot:abc", False),
    ("127.0.0.1:5000/tests/x:v1", True), ("library/alpine", True), ("python:3.12", True)])
def test_which_bases_are_images(name: str, image: bool) -> None:
    assert is_image(name) is image


def test_the_images_entrypoint_and_cmd_are_one_start_command() -> None:
    def start(entrypoint: tuple[str, ...], cmd: tuple[str, ...]) -> str:
        defaults = ImageDefaults(env={}, working_dir=None, user=None, entrypoint=entrypoint,
                                 cmd=cmd)
        return image_start(ImageBase("oci-x", "key", defaults), "img:1", 2)

    assert start(("tini", "--"), ("python", "-m", "http.server", "8 0")) == \
        "tini -- python -m http.server '8 0'"
    assert start((), ("sh", "-c", "echo $HOME")) == "sh -c 'echo $HOME'"
    with pytest.raises(BuildFailed, match="image img:1: it has no Entrypoint or Cmd") as caught:
        start((), ())
    assert caught.value.step == 3
