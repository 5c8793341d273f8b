"""The SDK's connection arguments as one typed value, so a test can pass `**creds` to
`Sandbox.create`, `Sandbox.connect` or `Client` and still have each argument type-checked."""

from __future__ import annotations

from typing import TypedDict


class Credentials(TypedDict):
    api_url: str
    api_key: str
