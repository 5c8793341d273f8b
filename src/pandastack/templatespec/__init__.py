"""Template specs: what a custom template is built from, shared by the SDK, the server and the
host (stdlib, pydantic and `pandastack.wire` only).

A spec names a base template, lists build steps (apt/pip/npm installs, commands, copied files,
ENV, WORKDIR, USER), and optionally a start command with a ready check. It is written with the
`Template` builder or read from a Dockerfile subset (`from_dockerfile`), travels as JSON
(`TemplateSpec`), and is built on the host inside a microVM
(`pandastack.host.templates.builds`), one cached step at a time: `step_key` names the state
after each step.
"""

from .builder import Template, copy_step, wait_for_command, wait_for_file, wait_for_port
from .dockerfile import from_dockerfile
from .models import (
    DEFAULT_WORKDIR,
    HOST_ONLY_STEPS,
    MAX_COPY_BYTES,
    MAX_STEPS,
    AptStep,
    CopyFile,
    CopyFromStep,
    CopyStep,
    EnvStep,
    NpmStep,
    PipStep,
    ReadyCheck,
    RunStep,
    StageSpec,
    TemplateSpec,
    TemplateStep,
    UserStep,
    WorkdirStep,
    describe_step,
    expand_env,
    step_key,
)

__all__ = [
    "DEFAULT_WORKDIR",
    "HOST_ONLY_STEPS",
    "MAX_COPY_BYTES",
    "MAX_STEPS",
    "AptStep",
    "CopyFile",
    "CopyFromStep",
    "CopyStep",
    "EnvStep",
    "NpmStep",
    "PipStep",
    "ReadyCheck",
    "RunStep",
    "StageSpec",
    "Template",
    "TemplateSpec",
    "TemplateStep",
    "UserStep",
    "WorkdirStep",
    "copy_step",
    "describe_step",
    "expand_env",
    "from_dockerfile",
    "step_key",
    "wait_for_command",
    "wait_for_file",
    "wait_for_port",
]
