"""Template specs without VMs: the builder, the Dockerfile subset, validation, step keys."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from pandastack.templatespec import (
    MAX_COPY_BYTES,
    MAX_STEPS,
    AptStep,
    CopyStep,
    EnvStep,
    PipStep,
    ReadyCheck,
    RunStep,
    Template,
    TemplateSpec,
    TemplateStep,
    UserStep,
    WorkdirStep,
    describe_step,
    expand_env,
    from_dockerfile,
    step_key,
    wait_for_command,
    wait_for_file,
    wait_for_port,
)


@pytest.fixture
def context(tmp_path: Path) -> Path:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.py").write_text("print('hi')\n")
    (tmp_path / "app" / "lib").mkdir()
    (tmp_path / "app" / "lib" / "util.py").write_text("X = 1\n")
    run = tmp_path / "run.sh"
    run.write_text("#!/bin/sh\necho run\n")
    run.chmod(0o755)
    (tmp_path / "index.html").write_text("<h1>hello</h1>\n")
    # Modes are part of what COPY records: set them, whatever umask an earlier test left.
    for path in (tmp_path / "app" / "main.py", tmp_path / "app" / "lib" / "util.py",
                 tmp_path / "index.html"):
        path.chmod(0o644)
    return tmp_path


def copy_step(step: object) -> CopyStep:
    assert isinstance(step, CopyStep)
    return step


def files_of(step: object) -> dict[str, tuple[int, bytes]]:
    return {f.path: (f.mode, f.content()) for f in copy_step(step).files}


# -- builder ------------------------------------------------------------------------------

def test_builder_produces_the_spec(context: Path) -> None:
    spec = (Template("python")
            .apt_install("jq", "libpq5=15.8-0+deb12u1")
            .pip_install("requests==2.32.3", "uvicorn[standard]>=0.29,<1")
            .npm_install("@types/node@20", "left-pad")
            .run("echo hi > /tmp/x")
            .run(["python", "-c", "print(1)"])
            .copy(context / "app", "/srv/app")
            .copy(context / "run.sh", "/usr/local/bin/run")
            .env({"A": "1"}, B="2")
            .workdir("/srv/app")
            .user("nobody")
            .start("python -m http.server 8000", ready=wait_for_port(8000, timeout_seconds=30))
            .to_spec())
    assert spec.from_template == "python"
    kinds = [s.kind for s in spec.steps]
    assert kinds == ["apt", "pip", "npm", "run", "run", "copy", "copy", "env", "workdir",
                     "user"]
    app = files_of(spec.steps[5])
    assert copy_step(spec.steps[5]).dst == "/srv/app"
    assert app == {"lib/util.py": (0o644, b"X = 1\n"), "main.py": (0o644, b"print('hi')\n")}
    # A single file to a path that does not end with '/': that path is the file.
    assert copy_step(spec.steps[6]).dst == "/usr/local/bin"
    assert files_of(spec.steps[6]) == {"run": (0o755, b"#!/bin/sh\necho run\n")}
    assert spec.steps[7] == EnvStep(env={"A": "1", "B": "2"})
    assert spec.start == "python -m http.server 8000"
    assert spec.ready == ReadyCheck(kind="port", value="8000", timeout_seconds=30)
    # The spec is plain JSON both ways.
    again = TemplateSpec.model_validate_json(spec.model_dump_json())
    assert again == spec


def test_builder_reads_files_when_copy_is_called(context: Path) -> None:
    builder = Template().copy(context / "index.html", "/site/")
    (context / "index.html").write_text("changed")
    assert files_of(builder.to_spec().steps[0]) == {"index.html": (0o644, b"<h1>hello</h1>\n")}


def test_builder_rejects_bad_input_where_it_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="apt package"):
        Template().apt_install("jq; rm -rf /")
    with pytest.raises(ValueError, match="pip package"):
        Template().pip_install("--index-url=http://evil")
    with pytest.raises(ValueError, match="npm package"):
        Template().npm_install("../x")
    with pytest.raises(ValueError, match="at least one"):
        Template().pip_install()
    with pytest.raises(ValueError, match="NUL"):
        Template().run("echo \0")
    with pytest.raises(ValueError, match="invalid user"):
        Template().user("root:root:root")
    with pytest.raises(ValueError, match="environment variable name"):
        Template().env({"1BAD": "x"})
    with pytest.raises(ValueError, match="cannot read"):
        Template().copy(tmp_path / "missing", "/x")
    with pytest.raises(ValueError, match="port"):
        wait_for_port(0)
    with pytest.raises(ValueError, match="base template"):
        Template("../evil").to_spec()
    with pytest.raises(ValueError, match="needs a start command"):
        TemplateSpec(ready=wait_for_file("/tmp/x"))


def test_ready_checks() -> None:
    assert wait_for_file("/tmp/up").kind == "file"
    assert wait_for_command("curl -sf localhost:8000").value == "curl -sf localhost:8000"
    assert ReadyCheck.model_validate({"kind": "port", "value": 8000}).port == 8000
    with pytest.raises(ValidationError):
        ReadyCheck(kind="port", value="80", timeout_seconds=0)


# -- validation of the wire form -------------------------------------------------------------

def test_steps_are_discriminated_by_kind() -> None:
    adapter: TypeAdapter[TemplateStep] = TypeAdapter(TemplateStep)
    assert adapter.validate_python({"kind": "pip", "packages": ["x"]}) == PipStep(packages=["x"])
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "curl", "url": "http://x"})
    with pytest.raises(ValidationError):
        adapter.validate_python({"kind": "run", "command": "x", "extra": 1})


def test_copy_paths_and_content_are_validated() -> None:
    good = {"path": "a/b.txt", "mode": 0o600, "content_b64": base64.b64encode(b"x").decode()}
    CopyStep(dst="/x", files=[good])  # type: ignore[list-item]
    for path in ("/abs", "../up", "a/../b", "a//b", "./a", "a/\0"):
        with pytest.raises(ValidationError):
            CopyStep(dst="/x", files=[{**good, "path": path}])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        CopyStep(dst="/x", files=[{**good, "content_b64": "not base64!"}])  # type: ignore[list-item]
    with pytest.raises(ValidationError):
        CopyStep(dst="/x", files=[{**good, "mode": 0o4755}])  # type: ignore[list-item]


def test_sizes_are_bounded() -> None:
    with pytest.raises(ValidationError):
        TemplateSpec(steps=[RunStep(command="true")] * (MAX_STEPS + 1))
    half = base64.b64encode(b"\0" * (MAX_COPY_BYTES // 2 + 1)).decode()
    step = {"kind": "copy", "dst": "/x", "files": [{"path": "a", "content_b64": half}]}
    with pytest.raises(ValidationError, match="MiB"):
        TemplateSpec.model_validate({"steps": [step, step]})


def test_copy_budget_stops_reading_early(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(MAX_COPY_BYTES + 1)
    with pytest.raises(ValueError, match="MiB"):
        Template().copy(big, "/x")


# -- Dockerfile subset ----------------------------------------------------------------------

DOCKERFILE = r"""
# syntax=docker/dockerfile:1
# pandastack: ready port 8000
# pandastack: ready-timeout 45
FROM base

RUN apt-get update && \
    apt-get install -y jq \
    # a comment inside a continuation is skipped
    curl
RUN ["python", "-c", "print(1)"]
ENV A=1 B="two words" C=
ENV D plain value with spaces
COPY app /srv/app/
COPY run.sh index.html /opt/
COPY index.html ./page.html
WORKDIR /srv/app
USER nobody
EXPOSE 8000
CMD ["python", "-m", "http.server", "8000"]
"""


def test_dockerfile_subset(context: Path) -> None:
    spec = from_dockerfile(DOCKERFILE, context)
    assert spec.from_template == "base"
    steps = spec.steps
    assert steps[0] == RunStep(command="apt-get update &&     apt-get install -y jq     curl")
    assert steps[1] == RunStep(command=["python", "-c", "print(1)"])
    assert steps[2] == EnvStep(env={"A": "1", "B": "two words", "C": ""})
    assert steps[3] == EnvStep(env={"D": "plain value with spaces"})
    assert files_of(steps[4]).keys() == {"main.py", "lib/util.py"}
    assert copy_step(steps[4]).dst == "/srv/app/"
    assert files_of(steps[5]) == {"index.html": (0o644, b"<h1>hello</h1>\n"),
                                  "run.sh": (0o755, b"#!/bin/sh\necho run\n")}
    assert copy_step(steps[6]).dst == "." and files_of(steps[6]).keys() == {"page.html"}
    assert steps[7] == WorkdirStep(path="/srv/app")
    assert steps[8] == UserStep(name="nobody")
    assert len(steps) == 9
    assert spec.start == "python -m http.server 8000"
    assert spec.ready == ReadyCheck(kind="port", value="8000", timeout_seconds=45)
    assert spec.exposed_ports == ["8000/tcp"]


@pytest.mark.parametrize("user", [
    "app", "_x-1", "0", "1000", "2147483646", "app:staff", "1000:1000", "app:1000",
    "1000:staff", "root:0",
])
def test_user_takes_dockerfiles_forms(user: str) -> None:
    assert from_dockerfile(f"FROM base\nARG U={user}\nUSER $U\n").steps == [UserStep(name=user)]
    assert Template().user(user).to_spec().steps == [UserStep(name=user)]


@pytest.mark.parametrize("user", [
    "", ":", "app:", ":staff", "a:b:c", "App", "1abc", "2147483647", "007", "-1", "1000 ",
    "app\n", "x" * 33, "1000:app:1", "app:Staff", "\u0661",
    "a" * 32 + ":" + "b" * 32,  # 65 characters: more than the store's column holds
])
def test_user_refuses_other_spellings(user: str) -> None:
    with pytest.raises(ValueError, match="invalid user"):
        UserStep(name=user)


@pytest.mark.parametrize(("cmd", "entrypoint", "start"), [
    ("CMD python app.py", None, "python app.py"),
    ('CMD ["echo", "a b"]', None, "echo 'a b'"),
    ('CMD ["--port", "80"]', 'ENTRYPOINT ["server"]', "server --port 80"),
    ("CMD --port 80", 'ENTRYPOINT ["server"]', "server /bin/sh -c '--port 80'"),
    ('CMD ["ignored"]', "ENTRYPOINT server --x", "server --x"),
])
def test_dockerfile_start_command(cmd: str, entrypoint: str | None, start: str) -> None:
    text = "FROM base\n" + (entrypoint + "\n" if entrypoint else "") + cmd + "\n"
    assert from_dockerfile(text).start == start


def test_dockerfile_env_keeps_escaped_dollars_for_the_build() -> None:
    spec = from_dockerfile('FROM base\nENV A=\\$HOME B="$HOME/x" C=\\$\n')
    step = spec.steps[0]
    assert isinstance(step, EnvStep)
    expanded = {k: expand_env(v, {"HOME": "/root"}) for k, v in step.env.items()}
    assert expanded == {"A": "$HOME", "B": "/root/x", "C": "$"}


def test_dockerfile_glob_and_ignored_metadata(context: Path) -> None:
    spec = from_dockerfile("from base\nLABEL a=b\ncopy *.sh /bin/\nmaintainer me\n", context)
    assert [s.kind for s in spec.steps] == ["copy"]
    assert files_of(spec.steps[0]).keys() == {"run.sh"}


@pytest.mark.parametrize(("text", "line", "message"), [
    ("RUN true\nFROM base\n", 1, "first instruction must be FROM"),
    ("FROM base AS build\nFROM build\n", 2, "FROM an earlier stage"),
    ("FROM base AS a\nFROM base AS A\n", 2, "used twice"),
    ("FROM base\n\nARG 1X=1\n", 3, "ARG: invalid name"),
    ("FROM base\nCOPY --from=2 /x /y\n", 2, "no earlier stage 2"),
    ("FROM base\nADD https://example.com/x.tgz /x\n", 2, "URL"),
    ("FROM base\nADD app.tar.gz /x\n", 2, "archive"),
    ("FROM base\nRUN --mount=type=cache,target=/x true\n", 2, "RUN flags"),
    ("FROM base\nRUN <<EOF\necho\nEOF\n", 2, "heredocs"),
    ("FROM base\nCOPY --chown=a app /x\n", 2, "COPY flags"),
    ("FROM base AS b\nFROM base\nCOPY --from=b --chown=a /x /y\n", 3, "COPY flags"),
    ("FROM base AS b\nFROM base\nCOPY --from=b /x /z /y\n", 3, "ending with '/'"),
    ("FROM base AS b\nFROM base\nCOPY --from=b /x* /y\n", 3, "wildcards"),
    ("FROM base\nFOO bar\n", 2, "unknown instruction FOO"),
    ("FROM base\nRUN\n", 2, "RUN needs arguments"),
    ("FROM base\nRUN echo \\\n  a\nUSER a:b:c\n", 4, "invalid user"),
    ("FROM base\nENV 1X=1\n", 2, "environment variable name"),
    ("FROM base\nRUN apt-get \\\n  install\nHEALTHCHECK CMD true\n", 4, "HEALTHCHECK"),
    ("FROM base\n# pandastack: ready socket 80\n", 2, "unknown ready check"),
    ("FROM base\n# pandastack: ready port http\n", 2, "ready port must be"),
    ("FROM base\n# pandastack: wat\n", 2, "directive"),
    ("# escape=`\nFROM base\n", 1, "escape"),
])
def test_dockerfile_errors_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(ValueError, match=f"line {line}: .*{message}"):
        from_dockerfile(text, Path("/nonexistent"))


def test_dockerfile_without_from_or_context() -> None:
    with pytest.raises(ValueError, match="no FROM"):
        from_dockerfile("# only a comment\n")
    with pytest.raises(ValueError, match="line 2: COPY needs a build context"):
        from_dockerfile("FROM base\nCOPY a /b\n")
    with pytest.raises(ValueError, match="needs a start command"):
        from_dockerfile("FROM base\n# pandastack: ready port 80\n")


def test_dockerfile_copy_cannot_escape_the_context(context: Path, tmp_path_factory:
                                                   pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text("s3cret")
    ctx = context
    for text in ("COPY ../nonexistent/secret /x", "COPY /../../etc/passwd /x",
                 f"COPY {os.path.relpath(outside / 'secret', ctx)} /x"):
        with pytest.raises(ValueError, match=r"line 2: .*outside the build context"):
            from_dockerfile(f"FROM base\n{text}\n", ctx)
    (ctx / "link").symlink_to(outside / "secret")
    with pytest.raises(ValueError, match="outside the build context"):
        from_dockerfile("FROM base\nCOPY link /x\n", ctx)
    (ctx / "app" / "evil").symlink_to(outside / "secret")
    with pytest.raises(ValueError, match="outside the build context"):
        from_dockerfile("FROM base\nCOPY app /x/\n", ctx)
    (ctx / "app" / "evil").unlink()
    (ctx / "app" / "dirlink").symlink_to(ctx / "app" / "lib")
    with pytest.raises(ValueError, match="symlinked directories"):
        from_dockerfile("FROM base\nCOPY app /x/\n", ctx)
    (ctx / "app" / "dirlink").unlink()
    (ctx / "inside").symlink_to(ctx / "index.html")  # a symlink within the context is fine
    spec = from_dockerfile("FROM base\nCOPY inside /x/\n", ctx)
    assert files_of(spec.steps[0]) == {"inside": (0o644, b"<h1>hello</h1>\n")}


def test_dockerfile_several_sources_need_a_directory(context: Path) -> None:
    with pytest.raises(ValueError, match=r"line 2: .*ending with '/'"):
        from_dockerfile("FROM base\nCOPY run.sh index.html /opt\n", context)


# -- step keys ------------------------------------------------------------------------------

def test_step_key_is_stable_and_changes_with_anything() -> None:
    root = "r" * 64
    step = RunStep(command="echo hi")
    key = step_key(root, step)
    assert key == step_key(root, RunStep.model_validate_json(step.model_dump_json()))
    assert len(key) == 64 and int(key, 16) >= 0
    # Deterministic across processes: no hash randomization, canonical JSON.
    canonical = json.dumps({"command": "echo hi", "kind": "run"}, separators=(",", ":"))
    import hashlib
    assert key == hashlib.sha256(f"{root}\n{canonical}".encode()).hexdigest()
    assert step_key("s" * 64, step) != key
    assert step_key(root, RunStep(command="echo ho")) != key
    assert step_key(root, RunStep(command=["echo", "hi"])) != key
    assert step_key(root, EnvStep(env={"A": "1", "B": "2"})) == \
        step_key(root, EnvStep(env={"B": "2", "A": "1"}))

    def copy(content: bytes, mode: int = 0o644) -> CopyStep:
        return CopyStep(dst="/x", files=[{"path": "f", "mode": mode,  # type: ignore[list-item]
                                          "content_b64": base64.b64encode(content).decode()}])

    assert step_key(root, copy(b"a")) == step_key(root, copy(b"a"))
    assert step_key(root, copy(b"a")) != step_key(root, copy(b"b"))
    assert step_key(root, copy(b"a")) != step_key(root, copy(b"a", 0o755))
    assert step_key(root, AptStep(packages=["a", "b"])) != \
        step_key(root, AptStep(packages=["b", "a"]))


def test_describe_and_expand() -> None:
    assert describe_step(RunStep(command="echo   a\nb")) == "RUN echo a b"
    assert describe_step(PipStep(packages=["x", "y"])) == "PIP x y"
    assert describe_step(RunStep(command="x" * 500)).endswith("...")
    env = {"PATH": "/usr/bin", "HOME": "/root", "EMPTY": ""}
    assert expand_env("/opt/bin:$PATH", env) == "/opt/bin:/usr/bin"
    assert expand_env("${HOME}/x ${NOPE}y", env) == "/root/x y"
    assert expand_env("${EMPTY:-dflt} ${HOME:+set} ${NOPE:+set}", env) == "dflt set "
    assert expand_env(r"cost \$5", env) == "cost $5"
