"""Which asyncio event loop the dtq processes run on.

uvloop (libuv) is used wherever it is installed (a dependency of dtq on CPython outside
Windows); why, with the figures, is in ARCHITECTURE.md ("Figures behind the hot-path choices").
``DTQ_EVENT_LOOP=asyncio`` forces the standard loop, e.g. to rule the loop out when chasing a bug.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from dtq.entrypoints.config import ConfigError

T = TypeVar("T")

#: Environment variable naming the loop: ``uvloop`` (default when installed) or ``asyncio``.
EVENT_LOOP_ENV = "DTQ_EVENT_LOOP"


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop :func:`run` will use.

    Raises:
        ConfigError: ``DTQ_EVENT_LOOP`` is neither ``uvloop`` nor ``asyncio``, or asks for
            uvloop where it is not installed.
    """
    wanted = os.environ.get(EVENT_LOOP_ENV, "").strip().lower()
    if wanted not in ("", "uvloop", "asyncio"):
        raise ConfigError(EVENT_LOOP_ENV, f"must be 'uvloop' or 'asyncio', not {wanted!r}")
    if wanted == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401 - optional at import time
    except ImportError:
        if wanted == "uvloop":
            raise ConfigError(EVENT_LOOP_ENV, "is 'uvloop' but uvloop is not installed") from None
        return "asyncio"
    return "uvloop"


def running_loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop running the caller (for start-up log lines).

    Raises:
        RuntimeError: no event loop is running.
    """
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion in a new event loop (``asyncio.run`` semantics).

    Args:
        coro: the coroutine to run; it owns the loop until it returns.

    Returns:
        What ``coro`` returned.

    Raises:
        ConfigError: see :func:`loop_name` (``coro`` is closed without running).
        Whatever ``coro`` raises.
    """
    try:
        name = loop_name()
    except ConfigError:
        coro.close()
        raise
    if name == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)
