"""A template's own exposed ports: the Dockerfile's EXPOSE and the builder's expose() read into
the spec in Docker's form ("8080/tcp"), each once; bad forms refused where they are written
(the line of the Dockerfile, the builder call, a 422 for the spec's JSON)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pandastack.templatespec import Template, TemplateSpec, from_dockerfile
from pandastack.templatespec.ports import MAX_EXPOSED_PORTS, merged_ports


def test_expose_forms_are_read_as_docker_writes_them() -> None:
    spec = from_dockerfile("FROM python:3.12-slim\nARG ADMIN=9000\nEXPOSE 8080\n"
                           "EXPOSE 8080/udp 80 443\nexpose 8080/TCP ${ADMIN} 7000-7002/UDP\n"
                           "CMD serve\n", build_args={"ADMIN": "9001"})
    assert spec.exposed_ports == ["8080/tcp", "8080/udp", "80/tcp", "443/tcp", "9001/tcp",
                                  "7000/udp", "7001/udp", "7002/udp"]
    assert spec.steps == [] and spec.start == "serve"  # EXPOSE adds no step


def test_only_the_last_stage_exposes() -> None:
    spec = from_dockerfile("FROM base AS build\nEXPOSE 1234\nRUN make\n"
                           "FROM node\nCOPY --from=build /out /srv\nEXPOSE 3000\n")
    assert spec.exposed_ports == ["3000/tcp"]
    assert from_dockerfile("FROM base AS build\nEXPOSE 1234\nFROM base\n").exposed_ports == []


@pytest.mark.parametrize(("line", "message"), [
    ("EXPOSE 80/http", "'80/http': the protocol is tcp, udp or sctp, not 'http'"),
    ("EXPOSE 0", "'0': a port is 1-65535"),
    ("EXPOSE 65536/udp", "'65536/udp': a port is 1-65535"),
    ("EXPOSE 9000-8000", "the range ends before it starts"),
    ("EXPOSE 1-5000", f"more than {MAX_EXPOSED_PORTS} ports"),
    ("EXPOSE 127.0.0.1:80:80", "is not a port .*, a port and protocol .* or a range"),
    ("EXPOSE http", "'http' is not a port"),
    ("EXPOSE $PORT", r"ARGs are substituted in EXPOSE, ENV values are not"),
    ("EXPOSE", "needs arguments"),
])
def test_bad_expose_names_its_line(line: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^Dockerfile line 3: EXPOSE.*{message}"):
        from_dockerfile(f"FROM base\nENV PORT=80\n{line}\n")


def test_expose_bound_over_several_lines() -> None:
    text = "FROM base\nEXPOSE 1-1000\nEXPOSE 2001-2024 1000\n"
    assert len(from_dockerfile(text).exposed_ports) == MAX_EXPOSED_PORTS
    with pytest.raises(ValueError, match=f"line 4: EXPOSE: more than {MAX_EXPOSED_PORTS} ports"):
        from_dockerfile(text + "EXPOSE 3000\n")


def test_builder_expose() -> None:
    spec = Template("python:3.12-slim").expose(8080, "53/UDP", "8080/tcp", "9000-9001") \
        .to_spec()
    assert spec.exposed_ports == ["8080/tcp", "53/udp", "9000/tcp", "9001/tcp"]
    assert Template().to_spec().exposed_ports == []
    with pytest.raises(ValueError, match="'x' is not a port"):
        Template().expose("x")
    with pytest.raises(ValueError, match="True is not a port"):
        Template().expose(True)


def test_the_spec_takes_single_ports_in_dockers_form() -> None:
    spec = TemplateSpec.model_validate({"exposed_ports": ["8080", "8080/tcp", "53/UDP"]})
    assert spec.exposed_ports == ["8080/tcp", "53/udp"]
    for bad, why in [(["8000-8001"], "one port, not a range"), (["80/http"], "protocol"),
                     ([80], "valid string"), (["1"] * (MAX_EXPOSED_PORTS + 1), "at most")]:
        with pytest.raises(ValidationError, match=why):
            TemplateSpec.model_validate({"exposed_ports": bad})


def test_the_image_and_the_template_ports_merge_once_sorted() -> None:
    assert merged_ports(("53/udp", "8080/tcp"), ["9000/tcp", "8080/tcp"]) == [
        "53/udp", "8080/tcp", "9000/tcp"]
    assert merged_ports((), []) == []


def test_a_spec_without_expose_is_sent_as_agents_before_expose_read_it() -> None:
    # An agent of the release before refuses unknown fields: without EXPOSE, no such field.
    assert "exposed_ports" not in TemplateSpec(from_template="base").model_dump(mode="json")
    spec = TemplateSpec(from_template="base", exposed_ports=["8080"])
    assert spec.model_dump(mode="json")["exposed_ports"] == ["8080/tcp"]
