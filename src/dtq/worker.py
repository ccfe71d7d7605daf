"""The stable public surface for handler authors (the Python form of the spec's ``pkg/worker``).

Import from here, not from ``dtq.entrypoints``::

    from dtq.worker import Options, PermanentError, Runtime, Task

    runtime = Runtime(Options(default_timeout=120.0))

    @runtime.handler("report.generate")
    async def generate(task: Task) -> None:
        if "account" not in task.payload:
            raise PermanentError("payload has no 'account'")  # failed at once, no retry
        ...  # return = success; any other exception = failure, retried by policy

Run it with ``dtq-worker --app mypackage.tasks:runtime``. Handlers may be ``async def`` or plain
``def`` (run in a thread pool). Delivery is at-least-once: a handler must be idempotent, and
``task.attempt`` can repeat after a lost worker (spec §4, §6).

Names:
    Task: what a handler receives (id, job_id, kind, payload, attempt).
    Handler: the handler type, ``Callable[[Task], Awaitable[None] | None]``.
    Runtime: register handlers by kind and run them.
    Options: timeouts, lease heartbeat, concurrency, shutdown grace (seconds).
    PermanentError: raise it to fail a task without retries.
"""

from __future__ import annotations

from dtq.entrypoints.runtime import Handler, Options, PermanentError, Runtime, Task

__all__ = ["Handler", "Options", "PermanentError", "Runtime", "Task"]
