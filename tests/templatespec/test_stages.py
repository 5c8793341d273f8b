"""ARG and multi-stage Dockerfiles read into a spec (issue 37 part 3): Docker's scoping and
substitution of ARG, stages named, numbered or images, unused stages dropped, the bounds;
and an image's own Entrypoint/Cmd asked for as the start command."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pandastack.rules import MAX_TEMPLATE_STAGES
from pandastack.templatespec import (
    CopyFromStep,
    EnvStep,
    RunStep,
    StageSpec,
    Template,
    TemplateSpec,
    UserStep,
    WorkdirStep,
    from_dockerfile,
    wait_for_port,
)
from pandastack.templatespec.stages import ArgScope

TWO_STAGES = """\
ARG BASE=base
ARG TOOL_VERSION=1.0
FROM ${BASE} AS build
ARG TOOL_VERSION
ARG OUT=/out
RUN mkdir -p $OUT && echo $TOOL_VERSION > $OUT/version
FROM $BASE
ARG APP=/srv/app
COPY --from=build /out/version ${APP}/version
WORKDIR $APP
"""


def test_two_stages_with_arg_defaults() -> None:
    spec = from_dockerfile(TWO_STAGES)
    assert spec.from_template == "base"
    assert spec.stages == [StageSpec(name="build", from_template="base", steps=[
        RunStep(command="export TOOL_VERSION=1.0 OUT=/out; "
                        "mkdir -p $OUT && echo $TOOL_VERSION > $OUT/version")])]
    assert spec.steps == [
        CopyFromStep(stage=0, sources=["/out/version"], dst="/srv/app/version"),
        WorkdirStep(path="/srv/app")]


def test_build_args_override_defaults_in_from_and_in_stages() -> None:
    spec = from_dockerfile(TWO_STAGES, build_args={"BASE": "python:3.12-slim",
                                                   "TOOL_VERSION": "2.5", "UNUSED": "x"})
    assert spec.from_template == spec.stages[0].from_template == "python:3.12-slim"
    run = spec.stages[0].steps[0]
    assert isinstance(run, RunStep) and isinstance(run.command, str)
    assert run.command.startswith("export TOOL_VERSION=2.5 ")


def test_a_global_arg_is_not_seen_in_a_stage_unless_declared_there() -> None:
    spec = from_dockerfile("ARG V=1\nFROM base\nENV A=$V\nARG V\nENV B=$V C=${V:+set}\n")
    assert spec.steps == [EnvStep(env={"A": "$V"}), EnvStep(env={"B": "1", "C": "set"})]


def test_env_of_the_same_name_wins_over_arg() -> None:
    spec = from_dockerfile("FROM base\nARG V=arg W=w\nENV V=env\nRUN echo $V\nENV X=$V$W\n"
                           "ARG V=again\nRUN true\n")
    # $V is left for the build's ENV expansion, and the RUN gets no ARG of that name, even
    # after the ARG is declared again (Docker: ENV always wins).
    assert spec.steps == [EnvStep(env={"V": "env"}),
                          RunStep(command="export W=w; echo $V"),
                          EnvStep(env={"X": "$Vw"}),
                          RunStep(command="export W=w; true")]


def test_unset_arg_is_empty_and_defaults_apply() -> None:
    spec = from_dockerfile("FROM base\nARG V\nWORKDIR /a${V}b/${V:-dflt}\nRUN true\n")
    assert spec.steps == [WorkdirStep(path="/ab/dflt"), RunStep(command="true")]


def test_exec_form_run_gets_args_through_env() -> None:
    spec = from_dockerfile("FROM base\nARG V='a b'\nRUN [\"printenv\", \"V\"]\n")
    assert spec.steps == [RunStep(command=["env", "V=a b", "printenv", "V"])]


def test_shell_form_run_quotes_arg_values() -> None:
    spec = from_dockerfile("FROM base\nARG V\nRUN echo \"$V\"\n",
                           build_args={"V": "it's; rm -rf /"})
    assert spec.steps == [RunStep(command="export V='it'\"'\"'s; rm -rf /'; echo \"$V\"")]


def test_escaped_dollar_is_left_alone() -> None:
    scope = ArgScope({"V": "x"})
    scope.declare("V", global_scope=False)
    assert scope.substitute(r"\$V $V ${V} $OTHER") == r"\$V x x $OTHER"


def test_stages_by_index_and_image_and_unused_ones_dropped() -> None:
    spec = from_dockerfile(
        "FROM base AS unused\nRUN false\n"
        "FROM node AS one\nRUN make\n"
        "FROM base AS two\nCOPY --from=1 /a /b\n"
        "FROM base\nCOPY --from=TWO /b /c/\nCOPY --from=busybox:1.36 /bin/busybox /bin/bb\n")
    assert [(s.name, s.from_template) for s in spec.stages] == [
        ("one", "node"), ("two", "base"), (None, "busybox:1.36")]
    assert spec.stages[1].steps == [CopyFromStep(stage=0, sources=["/a"], dst="/b")]
    assert spec.steps == [CopyFromStep(stage=1, sources=["/b"], dst="/c/"),
                          CopyFromStep(stage=2, sources=["/bin/busybox"], dst="/bin/bb")]


def test_only_the_last_stages_cmd_is_the_start_command() -> None:
    spec = from_dockerfile("FROM base AS b\nCMD [\"server\"]\nRUN true\n"
                           "FROM base\nCOPY --from=b /x /x\n")
    assert spec.start is None
    spec = from_dockerfile("FROM base AS b\nFROM base\nCMD serve\n")
    assert spec.start == "serve" and spec.stages == []


def test_stage_count_is_bounded() -> None:
    text = "".join(f"FROM base AS s{i}\n" for i in range(MAX_TEMPLATE_STAGES + 1))
    with pytest.raises(ValueError, match=f"line {MAX_TEMPLATE_STAGES + 1}: more than "
                                         f"{MAX_TEMPLATE_STAGES} stages"):
        from_dockerfile(text)
    # The spec itself, as the REST API receives it (a 422 there).
    stages = [StageSpec(from_template="base")] * MAX_TEMPLATE_STAGES
    with pytest.raises(ValidationError, match="at most"):
        TemplateSpec(stages=stages)


def test_a_stage_copies_only_from_an_earlier_one() -> None:
    with pytest.raises(ValidationError, match="only from an earlier one"):
        TemplateSpec(stages=[StageSpec(from_template="base")],
                     steps=[CopyFromStep(stage=1, sources=["/x"], dst="/y")])
    with pytest.raises(ValidationError, match="only from an earlier one"):
        TemplateSpec(stages=[StageSpec(from_template="base", steps=[
            CopyFromStep(stage=0, sources=["/x"], dst="/y")])])
    TemplateSpec(stages=[StageSpec(from_template="base")],
                 steps=[CopyFromStep(stage=0, sources=["/x"], dst="/y")])


def test_copy_from_sources_are_checked() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        CopyFromStep(stage=0, sources=["/x\0"], dst="/y")
    with pytest.raises(ValidationError, match="ending with '/'"):
        CopyFromStep(stage=0, sources=["/x", "/z"], dst="/y")


def test_user_and_copy_sources_take_args(tmp_path: Path) -> None:
    (tmp_path / "app-2.txt").write_text("two\n")
    spec = from_dockerfile("FROM base\nARG U=app V=1\nUSER $U\nCOPY app-${V}.txt /srv/\n",
                           tmp_path, build_args={"V": "2"})
    assert spec.steps[0] == UserStep(name="app")
    assert spec.steps[1].kind == "copy" and spec.steps[1].files[0].path == "app-2.txt"


def test_start_image_directive_and_builder() -> None:
    text = ("FROM python:3.12-slim\n# pandastack: start image\n"
            "# pandastack: ready port 8000\nRUN true\n")
    spec = from_dockerfile(text)
    assert spec.start_from_image is True and spec.start is None
    assert spec.ready is not None and spec.ready.port == 8000
    assert from_dockerfile("FROM base\nRUN true\n").start_from_image is None
    built = Template("python:3.12-slim").run("true").start_image(ready=wait_for_port(8000))
    assert built.to_spec() == spec
    with pytest.raises(ValueError, match="not both"):
        from_dockerfile(text + "CMD serve\n")
    with pytest.raises(ValueError, match="needs FROM an image, not the template 'base'"):
        from_dockerfile("FROM base\n# pandastack: start image\n")
    with pytest.raises(ValidationError, match="needs FROM an image"):
        TemplateSpec(from_template="snapshot:abc", start_from_image=True)
