"""The scripted guest (tests/host/fake_guest.py) as the `fake` fixture of these tests."""

from __future__ import annotations

from tests.host.fake_guest import fake

__all__ = ["fake"]
