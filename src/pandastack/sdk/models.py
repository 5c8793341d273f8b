"""The result types the SDK returns. They are the wire types of `pandastack.wire`, re-exported.

The SDK decodes replies leniently: fields a newer server adds are ignored, so an old SDK keeps
working against a new server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pandastack.wire import registries as _registries
from pandastack.wire import resources as _resources
from pandastack.wire import sandboxes as _sandboxes
from pandastack.wire import search as _search
from pandastack.wire import usage as _usage
from pandastack.wire.registries import *  # noqa: F403
from pandastack.wire.resources import *  # noqa: F403
from pandastack.wire.sandboxes import *  # noqa: F403
from pandastack.wire.search import *  # noqa: F403
from pandastack.wire.usage import *  # noqa: F403

# Each wire module's `__all__` names its results, so a new result model is not named here too.
__all__ = ["AsyncOutputCallback", "OutputCallback"]
__all__ += _registries.__all__
__all__ += _resources.__all__
__all__ += _sandboxes.__all__
__all__ += _search.__all__
__all__ += _usage.__all__

#: Called with each chunk of a command's output text, as it arrives.
OutputCallback = Callable[[str], object]
#: The async twin's callback: a plain function or a coroutine function (awaited).
AsyncOutputCallback = Callable[[str], Awaitable[object] | object]
