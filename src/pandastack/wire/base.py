"""The base of every wire model (the parts of `pandastack.wire`, `pandastack.templatespec`):
unknown fields are rejected. The package imports none of its parts, so the template spec can
build on this module while `wire.resources` imports the template spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
