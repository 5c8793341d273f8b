"""The TypeScript SDK (sdk-ts/) and the Python SDK have the same public surface: the same
classes, members and parameters, names mapped snake_case <-> camelCase (Python keyword
arguments are the properties of the TypeScript options object; see sdk-ts/scripts/surface.mjs),
except the differences listed, each with its reason, in sdk-ts/parity-exceptions.json. A listed
difference that is gone fails too, so the list only shrinks by being edited. Also here: the
generated wire types are what the generator makes of spec/openapi.json now.

The TypeScript surface is read from the compiled declarations, so the SDK is built first
(sdk-ts/scripts/build.sh: `npm ci` from the lock when it changed, then `tsc`).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pydantic
import pytest

from pandastack.sdk import (
    AsyncClient,
    AsyncCodeInterpreter,
    AsyncCommands,
    AsyncFilesystem,
    AsyncHosts,
    AsyncKeys,
    AsyncProcess,
    AsyncPty,
    AsyncSandbox,
    AsyncSandboxes,
    AsyncSnapshots,
    AsyncTeams,
    AsyncTemplates,
    AsyncTerminals,
    AsyncVolumes,
    AsyncWatch,
    Execution,
    Result,
    errors,
)
from pandastack.sdk.events import AsyncEvents, AsyncEventStream, AsyncWebhooks
from pandastack.sdk.registries import AsyncRegistries
from pandastack.templatespec import (
    MAX_COPY_BYTES,
    Template,
    TemplateSpec,
    from_dockerfile,
    wait_for_command,
    wait_for_file,
    wait_for_port,
)
from pandastack.webhooks import verify_signature

SDK = Path(__file__).resolve().parents[2] / "sdk-ts"

# The TypeScript SDK is async only: it mirrors the async twins (whose sync twins
# tests/sdk/test_parity.py holds to them).
PAIRS: list[tuple[type[Any], str]] = [
    (AsyncSandbox, "Sandbox"), (AsyncCommands, "Commands"), (AsyncProcess, "Process"),
    (AsyncFilesystem, "Filesystem"), (AsyncCodeInterpreter, "CodeInterpreter"),
    (AsyncTerminals, "Terminals"), (AsyncPty, "Pty"), (AsyncWatch, "Watch"),
    (AsyncClient, "Client"), (AsyncSandboxes, "Sandboxes"), (AsyncSnapshots, "Snapshots"),
    (AsyncTemplates, "Templates"), (AsyncVolumes, "Volumes"), (AsyncKeys, "Keys"),
    (AsyncHosts, "Hosts"), (AsyncTeams, "Teams"), (Execution, "Execution"), (Result, "Result"),
    (Template, "Template"), (AsyncEvents, "Events"), (AsyncEventStream, "EventStream"),
    (AsyncWebhooks, "Webhooks"), (AsyncRegistries, "Registries"),
]
# The template spec's helpers the Python SDK exports beside its classes, and the webhook check.
FUNCTIONS = [from_dockerfile, wait_for_port, wait_for_file, wait_for_command, verify_signature]
# Python's `TimeoutError` would shadow JavaScript's global of that name.
ERROR_NAMES = {"TimeoutError": "PandastackTimeoutError"}
# Python takes the constructor's arguments only where users call it (Client(...)).
CONSTRUCTED: set[type[Any]] = {AsyncClient, Template}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@pytest.fixture(scope="module")
def ts_surface() -> dict[str, Any]:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (scripts/host-deps.sh installs them)")
    subprocess.run(["bash", str(SDK / "scripts" / "build.sh")], check=True, timeout=600)
    out = subprocess.run(["node", str(SDK / "scripts" / "surface.mjs")], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    surface: dict[str, Any] = json.loads(out)
    return surface


@pytest.fixture(scope="module")
def listed() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SDK / "parity-exceptions.json").read_text())
    return data


def parameters(func: Any, renames: dict[str, str]) -> list[str]:
    names = []
    for p in inspect.signature(func).parameters.values():
        # *packages is a rest parameter in TypeScript (aptInstall(...packages)).
        if p.name in ("self", "cls") or p.kind == p.VAR_KEYWORD:
            continue
        names.append(renames.get(p.name, camel(p.name)))
    return names


def python_members(cls: type[Any], renames: dict[str, str]) -> dict[str, list[str]]:
    """Public member -> its parameters (camelCase); attributes have none."""
    if issubclass(cls, pydantic.BaseModel):
        own = [c for c in cls.__mro__ if issubclass(c, pydantic.BaseModel)
               and c is not pydantic.BaseModel]
        names = set(cls.model_fields) | {n for c in own for n in vars(c)
                                         if not n.startswith("_") and not n.startswith("model_")}
    else:
        names = {n for n in dir(cls) if not n.startswith("_")}
    out: dict[str, list[str]] = {}
    for name in sorted(names):
        attr = inspect.getattr_static(cls, name, None)
        if isinstance(attr, classmethod | staticmethod):
            out[camel(name)] = parameters(getattr(cls, name), renames)
        elif inspect.isfunction(attr):
            out[camel(name)] = parameters(attr, renames)
        else:
            out[camel(name)] = []
    if cls in CONSTRUCTED:
        out["constructor"] = parameters(cls.__init__, renames)
    return out


def differences(ts: dict[str, Any], renames: dict[str, str]) -> set[tuple[str, str]]:
    """(entry, the side that has it) for everything only one SDK has."""
    found: set[tuple[str, str]] = set()
    for py_cls, ts_name in PAIRS:
        ts_cls = ts["classes"].get(ts_name)
        if ts_cls is None:
            found.add((ts_name, "python"))
            continue
        py = python_members(py_cls, renames)
        tsm = {name: member["params"] for name, member in ts_cls.items()}
        for name in py.keys() - tsm.keys():
            found.add((f"{ts_name}.{name}", "python"))
        for name in tsm.keys() - py.keys():
            found.add((f"{ts_name}.{name}", "typescript"))
        for name in py.keys() & tsm.keys():
            for param in set(py[name]) - set(tsm[name]):
                found.add((f"{ts_name}.{name}({param})", "python"))
            for param in set(tsm[name]) - set(py[name]):
                found.add((f"{ts_name}.{name}({param})", "typescript"))
    py_errors = {ERROR_NAMES.get(n, n) for n in errors.__all__}
    for name in py_errors - set(ts["exports"]):
        found.add((name, "python"))
    for func in FUNCTIONS:
        if camel(func.__name__) not in ts["exports"]:
            found.add((camel(func.__name__), "python"))
    return found


def test_the_sdks_have_the_same_surface(ts_surface: dict[str, Any],
                                        listed: dict[str, Any]) -> None:
    renames = {py: entry["to"] for py, entry in listed["renames"].items()}
    found = differences(ts_surface, renames)
    allowed = {(e["entry"], e["only_in"]) for e in listed["exceptions"]}
    unlisted = sorted(found - allowed)
    stale = sorted(allowed - found)
    assert not unlisted, ("one SDK has what the other lacks; mirror it, or list it in "
                          f"sdk-ts/parity-exceptions.json with a reason: {unlisted}")
    assert not stale, f"listed in sdk-ts/parity-exceptions.json but no longer different: {stale}"


def test_every_exception_has_a_reason(listed: dict[str, Any]) -> None:
    entries = [e["entry"] for e in listed["exceptions"]]
    assert len(entries) == len(set(entries)), "an entry is listed twice"
    for entry in [*listed["exceptions"], *listed["renames"].values()]:
        assert entry["reason"].strip(), entry
        assert entry.get("only_in", "python") in ("python", "typescript"), entry


def test_the_surface_check_sees_a_missing_method(ts_surface: dict[str, Any]) -> None:
    """The comparison itself: a method dropped from the TypeScript side, or a parameter, is
    reported on the Python side."""
    pruned = json.loads(json.dumps(ts_surface))
    del pruned["classes"]["Sandbox"]["hibernate"]
    pruned["classes"]["Commands"]["run"]["params"].remove("cwd")
    found = differences(pruned, {"transport": "fetch"})
    assert ("Sandbox.hibernate", "python") in found
    assert ("Commands.run(cwd)", "python") in found


def test_errors_carry_the_python_attributes(ts_surface: dict[str, Any]) -> None:
    """Each error class has Python's attributes (status, code, requestId, and retryAfter,
    limit, value, current, build where Python has them)."""
    for name in errors.__all__:
        py_cls = getattr(errors, name)
        ts_cls = ts_surface["classes"].get(ERROR_NAMES.get(name, name))
        if ts_cls is None:  # an alias (ValidationError, TransportError): a const in TS
            assert ERROR_NAMES.get(name, name) in ts_surface["exports"]
            continue
        wanted = {"status", "code", "requestId"} | {
            camel(p) for p in inspect.signature(py_cls.__init__).parameters
            if p not in ("self", "message", "args", "kwargs", "status", "code", "request_id")}
        assert wanted <= ts_cls.keys(), (name, sorted(wanted - ts_cls.keys()))


def test_generated_wire_types_are_current(ts_surface: dict[str, Any]) -> None:
    """sdk-ts/src/generated/openapi.ts is what openapi-typescript makes of spec/openapi.json
    (run `npm run gen` in sdk-ts/ after regenerating the document)."""
    proc = subprocess.run(["node", str(SDK / "scripts" / "gen-types.mjs"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    header = (SDK / "src" / "generated" / "openapi.ts").read_text()[:300]
    assert re.search(r"Generated by sdk-ts/scripts/gen-types\.mjs", header)


DOCKERFILES = [
    "FROM base\nRUN pip install flask\nCMD python app.py\n",
    "FROM python\n# pandastack: ready port 8000\n# pandastack: ready-timeout 60\n"
    "ENV A=1 B=\"two words\" C='x y' D=\\$HOME\nENV PLAIN some value  \nWORKDIR /srv\n"
    "USER app\nEXPOSE 8000\nENTRYPOINT [\"python\", \"-m\"]\nCMD [\"http.server\", \"8000\"]\n",
    "# syntax=docker/dockerfile:1\nfrom base\nrun apt-get update && \\\n    # a comment inside\n"
    "    apt-get install -y curl\nRUN [\"sh\", \"-c\", \"echo hi\"]\nENTRYPOINT sh -c 'serve'\n"
    "CMD ignored\n",
    "FROM base\nENTRYPOINT [\"tini\", \"--\"]\nCMD node server.js --port 3000\n",
    "FROM base\nRUN echo 'it''s'\nCMD [\"echo\", \"a b\", \"\", \"c'd\"]\n",
    "FROM base\r\nRUN true\r\n",
    # ARG and multi-stage builds: scopes, substitution, RUN's environment, stages by name,
    # index and image, unused ones dropped, only the last stage's CMD.
    "ARG BASE=base\nARG V=1\nFROM ${BASE} AS Build\nARG V\nARG W='a b'\nRUN make V=$V\n"
    "ENV W=env X=${V:-none}${W}\nRUN [\"printenv\", \"W\"]\nCMD [\"ignored\"]\n"
    "FROM busybox:1.36 AS unused\nRUN false\n"
    "FROM $BASE AS two\nCOPY --from=build /out/v /opt/v\n"
    "FROM node\nARG APP=/srv/app U=app\nCOPY --from=1 /opt/v ${APP}/\n"
    "COPY --from=alpine:3.19 /bin/busybox /bin/a /usr/local/bin/\nWORKDIR $APP\nUSER $U\n"
    "CMD serve\n",
    "ARG X\nFROM base\nARG X\nARG Y=$X\nRUN echo \"$X\" '$Y' ${Z}\n",
    "FROM python:3.12-slim\n# pandastack: start image\n# pandastack: ready port 80\n",
    # USER in Docker's forms: names, ids and both with a group.
    "FROM base\nARG G=staff\nUSER 1000:1000\nRUN id\nUSER app:$G\nUSER 0:root\n"
    "USER 2147483646:app\nUSER 65534\n",
    "ARG P=9000\nFROM base AS b\nEXPOSE 1\nFROM python:3\nARG P\n"
    "EXPOSE 8080 8080/UDP $P 7000-7001/tcp\nexpose 8080\n",
]
BAD_DOCKERFILES = [
    "RUN true\n", "FROM base AS b\nFROM b\n", "FROM base AS b\nFROM node AS B\n",
    "FROM base\nARG 1X\n", "FROM base\nCOPY --from=3 /a /b\n",
    "FROM base AS b\nFROM base\nCOPY --from=b /x* /y\n",
    "FROM base AS b\nFROM base\nCOPY --from=b /a /b /c\n",
    "".join(f"FROM base AS s{i}\n" for i in range(9)),
    "FROM bad%name AS b\nFROM base\n",
    "FROM base\n# pandastack: start image\n", "FROM a:1\n# pandastack: start image\nCMD x\n",
    "FROM base\nRUN --mount=type=cache true\n", "FROM base\nUSER app:app:app\n",
    "FROM base\nUSER 2147483647\n", "FROM base\nARG G\nUSER app:$G\n",
    "FROM base\nENV A=\"unclosed\n", "FROM base\n# pandastack: ready socket 1\n",
    "FROM base\nFROB x\n", "# escape=`\nFROM base\n", "FROM base\nRUN <<EOF\n",
    "FROM base\nRUN true\nEXPOSE 80/http\n", "FROM base\nEXPOSE $PORT\n",
    "FROM base\nEXPOSE 1-1000\nEXPOSE 1001-1100\n",
]


BUILD_ARGS = {"BASE": "python:3.12-slim", "V": "it's 2", "X": "x", "UNUSED": "u"}


def ts_dockerfiles(texts: list[str], build_args: dict[str, str] | None = None) -> list[Any]:
    script = ("import { readFileSync } from 'node:fs';"
              "import { fromDockerfile } from './dist/src/index.js';"
              f"const args = {json.dumps(build_args or {})};"
              "const out = JSON.parse(readFileSync(0, 'utf8')).map((t) => {"
              " try { return { spec: fromDockerfile(t, undefined, args) }; }"
              " catch (e) { return { error: e.message }; } });"
              "process.stdout.write(JSON.stringify(out));")
    proc = subprocess.run(["node", "--input-type=module", "-e", script], cwd=SDK,
                          input=json.dumps(texts), capture_output=True, text=True, check=True,
                          timeout=60)
    result: list[Any] = json.loads(proc.stdout)
    return result


def test_dockerfiles_read_the_same_in_both_sdks(ts_surface: dict[str, Any]) -> None:
    """The TypeScript port of templatespec/dockerfile.py makes the spec Python makes, and
    refuses what Python refuses (at the same line)."""
    from pandastack.templatespec import TemplateSpec, from_dockerfile

    for text, got in zip(DOCKERFILES, ts_dockerfiles(DOCKERFILES), strict=True):
        assert "spec" in got, (text, got)
        want = from_dockerfile(text).model_dump(mode="json")
        assert TemplateSpec.model_validate(got["spec"]).model_dump(mode="json") == want, text
    for text, got in zip(DOCKERFILES, ts_dockerfiles(DOCKERFILES, BUILD_ARGS), strict=True):
        assert "spec" in got, (text, got)
        want = from_dockerfile(text, build_args=BUILD_ARGS).model_dump(mode="json")
        assert TemplateSpec.model_validate(got["spec"]).model_dump(mode="json") == want, text
    for text, got in zip(BAD_DOCKERFILES, ts_dockerfiles(BAD_DOCKERFILES), strict=True):
        with pytest.raises(ValueError) as caught:
            from_dockerfile(text)
        assert "error" in got, (text, got)
        where = re.match(r"Dockerfile( line \d+)?", str(caught.value))
        assert where and got["error"].startswith(where.group(0)), (text, got, str(caught.value))


# Both SDKs read a build context into copy steps (templatespec/builder.py and its port,
# sdk-ts/src/copy.ts). One tree holds what the cases below read: nested directories, a
# hidden file, modes, a symlink that stays inside, one that leaves, a symlinked directory,
# and a file and a file count each past the limits.
def make_context(root: Path) -> Path:
    ctx = root / "ctx"
    (ctx / "app" / "sub" / "deep").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("print('hi')\n")
    (ctx / "app" / ".hidden").write_bytes(b"\x00\xffbinary")
    (ctx / "app" / "sub" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (ctx / "app" / "sub" / "run.sh").chmod(0o755)
    (ctx / "app" / "sub" / "deep" / "é-ü.txt").write_text("unicode name\n")
    (ctx / "data").mkdir()
    (ctx / "data" / "inside.txt").write_text("inside\n")
    (ctx / "app" / "link-in").symlink_to("../data/inside.txt")
    (ctx / "readme.md").write_text("# readme\n")
    (ctx / "cfg").mkdir()
    for name in ("b.json", "a.json", "c.yaml"):
        (ctx / "cfg" / name).write_text("{}\n")
    (root / "outside").mkdir()
    (root / "outside" / "secret.txt").write_text("secret\n")
    (ctx / "bad-out").mkdir()
    (ctx / "bad-out" / "leak").symlink_to("../../outside/secret.txt")
    (ctx / "bad-dir").mkdir()
    (ctx / "bad-dir" / "linked").symlink_to("../app")
    (ctx / "big").mkdir()
    with (ctx / "big" / "huge.bin").open("wb") as f:
        f.truncate(MAX_COPY_BYTES + 1)  # sparse: refused from its size, before any read
    (ctx / "many").mkdir()
    for i in range(10_001):
        (ctx / "many" / f"f{i}").touch()
    return ctx


COPY_DOCKERFILES = [
    "FROM base\nCOPY app /srv/app/\nCOPY readme.md /srv/README\nCOPY readme.md /srv/docs/\n"
    "COPY cfg/*.json data/inside.txt /etc/cfg/\nADD [\"app/main.py\", \"/opt/\"]\n"
    "COPY /app/sub rel\nCOPY app/sub/run.sh .\nCOPY a*/s?b/[d-e]*/ /globbed/\n",
    "FROM base\nCOPY **/*.json /all/\nCOPY app/./sub//deep /d\nWORKDIR /srv\nCMD [\"sh\"]\n",
]
BAD_COPY_DOCKERFILES = [
    "FROM base\nCOPY bad-out /x/\n",  # a symlink out of the context
    "FROM base\nCOPY bad-dir /x/\n",  # a symlinked directory
    "FROM base\nCOPY ../outside/secret.txt /x\n",  # outside by its path
    "FROM base\nRUN true\nCOPY nope /x\n",
    "FROM base\nCOPY *.nothing /x/\n",
    "FROM base\nCOPY readme.md app /x\n",
    "FROM base\nADD app.tar.gz /x/\n",
    "FROM base\nADD https://example.com/a /x\n",
    "FROM base\nCOPY --chown=app readme.md /x\n",
    "FROM base\nCOPY readme.md\n",
    "FROM base\nCOPY big /x/\n",  # over MAX_COPY_BYTES
    "FROM base\nCOPY app /a/\nCOPY many /x/\n",  # over MAX_COPY_FILES
]


def builder_ops(ctx: Path) -> list[list[Any]]:
    return [
        ["aptInstall", "curl", "git=1:2.39.2-1"], ["pipInstall", "flask==3.0.0", "requests"],
        ["npmInstall", "@scope/pkg@1.2.3"], ["run", ["echo", "hi"]], ["run", "make all"],
        ["copy", str(ctx / "app"), "/srv/app/"], ["copy", str(ctx / "readme.md"), "/srv/README"],
        ["copy", str(ctx / "bad-out"), "/leak/"],  # no context: a symlink may point anywhere
        ["env", {"A": "1", "PATH": "/x:$PATH"}], ["workdir", "/srv"], ["user", "app"],
        ["user", "1000:1000"], ["user", "app:0"],
        ["start", "python -m http.server 8000", ["waitForPort", 8000, 30]],
        ["expose", 8080, "53/UDP", "9000-9001", "8080/tcp"],
    ]


BAD_BUILDER_OPS = [
    [["pipInstall", "bad name"]], [["aptInstall"]], [["user", "1000:"]], [["user", "01"]],
    [["user", "a:b:c"]], [["user", "4294967296"]], [["user", "a" * 32 + ":" + "b" * 32]],
    [["run", "  "]],
    [["env", {"1A": "x"}]], [["start", "serve", ["waitForPort", 0]]],
    [["start", "serve", ["waitForFile", "/up", 0]]], [["copy", "/nonexistent-ps", "/x"]],
    [["copy", "@ctx/big", "/x/"]], [["copy", "@ctx/app", "/a/"], ["copy", "@ctx/many", "/m/"]],
    [["expose", "80/http"]], [["expose", "9-1"]],
]


def python_template(ops: list[list[Any]], ctx: Path) -> TemplateSpec:
    waits: dict[str, Any] = {"waitForPort": wait_for_port, "waitForFile": wait_for_file,
                             "waitForCommand": wait_for_command}
    template = Template("python")
    for name, *args in ops:
        args = [a.replace("@ctx", str(ctx)) if isinstance(a, str) else a for a in args]
        method = getattr(template, re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), name))
        if name == "start" and len(args) == 2:
            args[1] = waits[args[1][0]](*args[1][1:])
        method(*args)
    return template.to_spec()


def ts_copy_cases(cases: list[dict[str, Any]]) -> list[Any]:
    script = """
import { readFileSync } from 'node:fs';
import * as sdk from './dist/src/index.js';
const run = (c) => {
  if (c.dockerfile !== undefined) return sdk.fromDockerfile(c.dockerfile, c.context ?? undefined);
  const t = new sdk.Template('python');
  for (const [name, ...args] of c.ops) {
    const real = args.map((a) => typeof a === 'string' ? a.replace('@ctx', c.context) : a);
    if (name === 'start' && real.length === 2) real[1] = sdk[real[1][0]](...real[1].slice(1));
    t[name](...real);
  }
  return t.toSpec();
};
const out = JSON.parse(readFileSync(0, 'utf8')).map((c) => {
  try { return { spec: run(c) }; }
  catch (e) { return { error: e.message, invalid: e instanceof sdk.InvalidRequestError }; } });
process.stdout.write(JSON.stringify(out));
"""
    proc = subprocess.run(["node", "--input-type=module", "-e", script], cwd=SDK,
                          input=json.dumps(cases), capture_output=True, text=True, check=True,
                          timeout=120)
    result: list[Any] = json.loads(proc.stdout)
    return result


def python_error(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return str(exc)


def same_refusal(py: str, ts: str) -> bool:
    """The same message, but for what the OS said about an unreadable path (errno texts
    differ between the runtimes): `cannot read <path>: ...` is compared up to the path."""
    cut = re.compile(r"(cannot read [^:]+): .*")
    return cut.sub(r"\1", py) == cut.sub(r"\1", ts)


def test_build_contexts_read_the_same_in_both_sdks(ts_surface: dict[str, Any],
                                                   tmp_path: Path) -> None:
    """COPY/ADD and the builder's copy(): the same context gives the same spec JSON in both
    SDKs (files, modes, contents, destinations, glob matches), and what Python refuses
    (symlinks leaving the context, symlinked directories, paths outside, the byte and file
    limits) TypeScript refuses with the same message, as an InvalidRequestError."""
    ctx = make_context(tmp_path)
    cases: list[dict[str, Any]] = [
        *({"dockerfile": t, "context": str(ctx)} for t in COPY_DOCKERFILES),
        # relative to the process's directory, as Python's context_dir may be
        {"dockerfile": COPY_DOCKERFILES[1], "context": os.path.relpath(ctx, SDK)},
        {"ops": builder_ops(ctx), "context": str(ctx)},
    ]
    got = ts_copy_cases(cases)
    for case, result in zip(cases[:len(COPY_DOCKERFILES)], got, strict=False):
        assert "spec" in result, (case, result)
        want = from_dockerfile(case["dockerfile"], Path(case["context"]))
        assert want.steps and any(s.kind == "copy" for s in want.steps)
        assert TemplateSpec.model_validate(result["spec"]) == want, case["dockerfile"]
    assert got[len(COPY_DOCKERFILES)] == got[1]  # the relative context read the same files
    spec = python_template(builder_ops(ctx), ctx)
    assert "spec" in got[-1], got[-1]
    assert TemplateSpec.model_validate(got[-1]["spec"]) == spec
    copied = [f.path for s in spec.steps if s.kind == "copy" for f in s.files]
    assert {".hidden", "link-in", "sub/deep/é-ü.txt", "leak"} <= set(copied)

    bad: list[dict[str, Any]] = [
        *({"dockerfile": t, "context": str(ctx)} for t in BAD_COPY_DOCKERFILES),
        {"dockerfile": "FROM base\nCOPY a /b\n", "context": None},
        *({"ops": ops, "context": str(ctx)} for ops in BAD_BUILDER_OPS),
    ]
    classes = ["is outside the build context", "symlinked directories are not supported",
               "copied files exceed 64 MiB together", "more than 10000 copied files",
               "needs a build context directory", "cannot read"]
    seen: set[str] = set()
    for case, result in zip(bad, ts_copy_cases(bad), strict=True):
        with pytest.raises(ValueError) as caught:
            if "dockerfile" in case:
                from_dockerfile(case["dockerfile"],
                                Path(case["context"]) if case["context"] else None)
            else:
                python_template(case["ops"], ctx)
        refusal = python_error(caught.value)
        assert "error" in result and result["invalid"], (case, result, refusal)
        assert same_refusal(refusal, result["error"]), (case, refusal, result["error"])
        seen |= {c for c in classes if c in refusal}
    assert seen == set(classes)  # every refusal the brief names was met
