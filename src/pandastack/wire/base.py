"""The base of every wire model (`pandastack.wire`, `pandastack.templatespec`): unknown fields
are rejected. Its own module so that the template spec can use it while `wire` imports the
template spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
