"""``--app``: import the :class:`~dtq.worker.Runtime` a worker or ``dtq dev`` runs."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

from dtq.entrypoints.cli.common import UsageError

if TYPE_CHECKING:
    from dtq.entrypoints.worker.runtime import Runtime

DEFAULT_APP = "dtq.entrypoints.worker.runtime:demo_runtime"
_WANTED = "--app names a Runtime, or a callable that returns one when called with none"


def load_runtime(spec: str | None) -> Runtime:
    """Import the runtime named by ``--app``.

    Args:
        spec: ``package.module:attribute``; the attribute is a ``Runtime`` or a zero-argument
            callable returning one. None loads the demo runtime; an empty spec is malformed,
            never the demo.

    Returns:
        The runtime.

    Raises:
        UsageError: the spec is malformed, the module cannot be imported (or raised while being
            imported), the attribute is missing, or it is not a runtime; a callable that needs
            arguments or is an ``async def`` (a handler, most likely) is refused without being
            called, saying what it is and what ``--app`` names.
    """
    from dtq.entrypoints.worker.runtime import Runtime

    text = DEFAULT_APP if spec is None else spec
    module_name, sep, attr_path = text.partition(":")
    if not sep or not module_name or not attr_path:
        raise UsageError("--app", f"expected 'module:attribute', got {text!r}")
    # Like uvicorn: the working directory is importable, so `--app myapp.tasks:runtime` works
    # from the folder that holds `myapp/` without setting PYTHONPATH.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name or module_name.startswith(f"{exc.name}."):
            raise UsageError("--app", f"no module named {module_name!r}") from None
        raise UsageError("--app", f"importing {module_name!r} failed: {_describe(exc)}") from None
    except Exception as exc:
        raise UsageError("--app", f"importing {module_name!r} failed: {_describe(exc)}") from None
    target: Any = module
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(
                "--app", f"module {module_name!r} has no attribute {attr_path!r}"
            ) from None
    if isinstance(target, Runtime):
        return target
    if callable(target):
        return _made_by(target, text)
    raise UsageError("--app", f"{text!r} is a {type(target).__name__}, not a Runtime")


def _made_by(factory: Any, text: str) -> Runtime:
    """The runtime ``factory()`` returns (``text``: the ``--app`` that named it).

    Raises:
        UsageError: it needs arguments or is an ``async def`` (not called), it raised, or it
            returned something else.
    """
    from dtq.entrypoints.worker.runtime import Runtime

    problem = _not_a_factory(factory)
    if problem is not None:
        raise UsageError("--app", f"{text!r} is {problem}; {_WANTED}")
    try:
        made = factory()
    except Exception as exc:
        raise UsageError("--app", f"calling {text!r} failed: {_describe(exc)}") from None
    if isinstance(made, Runtime):
        return made
    raise UsageError("--app", f"{text!r} returned {type(made).__name__}, not a Runtime")


def _not_a_factory(target: Any) -> str | None:
    """What ``target`` is (``async function echo(task), which takes arguments``) when a call
    without arguments cannot give a runtime, else None (also when it has no signature to read)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    name = getattr(target, "__name__", "")
    if inspect.iscoroutinefunction(target):
        what = f"async function {name}{signature}"
    elif inspect.isfunction(target) or inspect.ismethod(target):
        what = f"function {name}{signature}"
    elif inspect.isclass(target):
        what = f"class {name}{signature}"
    else:
        what = f"a callable {type(target).__name__}{signature}"
    try:
        signature.bind()
    except TypeError:
        return f"{what}, which takes arguments"
    if inspect.iscoroutinefunction(target):
        return f"{what}, which returns a coroutine"
    return None


def _describe(exc: BaseException) -> str:
    """``Type: message (at file:line)`` of the innermost frame, on one line."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})"
    elif isinstance(exc, SyntaxError) and exc.filename:
        where = f" (at {exc.filename}:{exc.lineno})"
    return f"{type(exc).__name__}: {exc}{where}"
