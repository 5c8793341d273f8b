"""What the Dockerfile parser needs for ARG and multi-stage builds: the ARG scopes with
Docker's substitution, and the dropping of stages the last one does not copy from."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from .models import ENV_NAME_RE, CopyFromStep, StageSpec, TemplateStep, substitute_refs


class ArgScope:
    """ARG values as Docker scopes them: those declared before the first FROM serve FROM
    lines only; a stage sees the ones it declares (a bare `ARG NAME` takes the global
    default), until its end. A build arg overrides a default; an ENV of the same name in the
    stage hides the ARG from then on, even one declared again (`$NAME` is then the ENV's,
    expanded by the build)."""

    def __init__(self, build_args: Mapping[str, str]) -> None:
        self.build_args = dict(build_args)
        self.globals: dict[str, str | None] = {}
        self.stage: dict[str, str | None] = {}
        self.shadowed: set[str] = set()

    def new_stage(self) -> None:
        self.stage, self.shadowed = {}, set()

    def declare(self, word: str, *, global_scope: bool) -> None:
        name, eq, default = word.partition("=")
        if not ENV_NAME_RE.match(name) or len(name) > 256:
            raise ValueError(f"ARG: invalid name {name!r}")
        value: str | None
        if name in self.build_args:
            value = self.build_args[name]
        elif eq:
            value = self.substitute(default, in_from=global_scope)
        else:
            value = None if global_scope else self.globals.get(name)
        if "\0" in (value or ""):
            raise ValueError(f"ARG {name}: NUL byte in its value")
        if global_scope:
            self.globals[name] = value
        else:
            self.stage[name] = value

    def shadow(self, env: Mapping[str, str]) -> None:
        self.shadowed.update(env)

    def _visible(self, in_from: bool) -> dict[str, str | None]:
        if in_from:
            return self.globals
        return {k: v for k, v in self.stage.items() if k not in self.shadowed}

    def substitute(self, text: str, *, in_from: bool = False) -> str:
        """`$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}` of declared ARGs replaced
        (an unset one is empty); any other `$...` and `\\$` are left for the build's ENV
        expansion."""
        known = self._visible(in_from)
        return substitute_refs(text, lambda name: (known[name] or "") if name in known else None,
                               unescape=False)

    def run_env(self, command: str | list[str]) -> str | list[str]:
        """A RUN command with the stage's set ARGs in its environment, as Docker gives them
        (not kept in the template: a later step does not see them)."""
        env = {k: v for k, v in self._visible(False).items() if v is not None}
        if not env:
            return command
        if isinstance(command, list):
            return ["env", *(f"{k}={v}" for k, v in env.items()), *command]
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"export {exports}; {command}"


def _refs(steps: list[TemplateStep]) -> set[int]:
    return {s.stage for s in steps if isinstance(s, CopyFromStep)}


def prune_stages(stages: list[StageSpec], steps: list[TemplateStep]
                 ) -> tuple[list[StageSpec], list[TemplateStep]]:
    """Only the stages the last one copies from (directly or through others), renumbered, as
    BuildKit skips the rest: each stage is a VM to run."""
    needed = _refs(steps)
    for index in range(len(stages) - 1, -1, -1):
        if index in needed:
            needed |= _refs(stages[index].steps)
    renumber = {old: new for new, old in enumerate(sorted(needed))}

    def moved(items: list[TemplateStep]) -> list[TemplateStep]:
        return [s.model_copy(update={"stage": renumber[s.stage]})
                if isinstance(s, CopyFromStep) else s for s in items]

    kept = [stage.model_copy(update={"steps": moved(stage.steps)})
            for index, stage in enumerate(stages) if index in needed]
    return kept, moved(steps)
