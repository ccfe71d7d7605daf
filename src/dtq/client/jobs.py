"""A small builder for DAG jobs by name (``POST /v1/jobs``, spec §7).

Example::

    job = JobBuilder("nightly-etl")
    raw = job.task("extract", "etl.extract", payload={"day": "2026-12-01"})
    clean = job.task("clean", "etl.clean", depends_on=[raw])
    job.task("load", "etl.load", depends_on=[clean], max_attempts=5)
    client.submit_job(job)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dtq.client.errors import InvalidRequest

__all__ = ["JobBuilder", "TaskRef", "task_options"]


@dataclass(frozen=True, slots=True)
class TaskRef:
    """A task added to a :class:`JobBuilder`, to name it in another task's ``depends_on``."""

    name: str


@dataclass(slots=True)
class JobBuilder:
    """Collects the tasks of one job; :meth:`body` is the ``POST /v1/jobs`` request body.

    The builder checks only what it must to build the body (unique names, dependencies on
    tasks it holds); every other rule is the server's, reported as :class:`~dtq.client.errors.
    BadRequest` naming the field.
    """

    name: str | None = None
    metadata: Any = None
    _tasks: list[dict[str, Any]] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)

    def task(
        self,
        name: str,
        kind: str,
        payload: Any = None,
        *,
        depends_on: Iterable[TaskRef | str] = (),
        priority: str | None = None,
        max_attempts: int | None = None,
        delay: str | timedelta | None = None,
        run_at: datetime | None = None,
        retry: Mapping[str, Any] | None = None,
        timeout: str | timedelta | None = None,
    ) -> TaskRef:
        """Add a task; returns its reference for later ``depends_on``.

        Raises:
            ValueError: ``name`` is already used in this job, or a dependency names a task not
                added yet (add tasks in dependency order).
        """
        if name in self._names:
            raise ValueError(f"task name {name!r} is already used in this job")
        spec: dict[str, Any] = {"name": name, "kind": kind}
        if payload is not None:
            spec["payload"] = payload
        parents = [d.name if isinstance(d, TaskRef) else d for d in depends_on]
        for parent in parents:
            if parent not in self._names:
                raise ValueError(f"task {name!r} depends on {parent!r}, which is not in the job")
        if parents:
            spec["depends_on"] = parents
        spec.update(
            task_options(
                priority=priority,
                max_attempts=max_attempts,
                delay=delay,
                run_at=run_at,
                retry=retry,
                timeout=timeout,
            )
        )
        self._tasks.append(spec)
        self._names.add(name)
        return TaskRef(name)

    def body(self) -> dict[str, Any]:
        """The request body.

        Raises:
            ValueError: the job has no task.
        """
        if not self._tasks:
            raise ValueError("a job needs at least one task")
        body: dict[str, Any] = {"tasks": list(self._tasks)}
        if self.name is not None:
            body["name"] = self.name
        if self.metadata is not None:
            body["metadata"] = self.metadata
        return body


def task_options(
    *,
    priority: str | None = None,
    max_attempts: int | None = None,
    delay: str | timedelta | None = None,
    run_at: datetime | None = None,
    retry: Mapping[str, Any] | None = None,
    timeout: str | timedelta | None = None,
) -> dict[str, Any]:
    """The optional fields of a task in request form; a ``timedelta`` becomes a Go duration
    (:func:`go_duration`) and an aware ``datetime`` an RFC 3339 string.

    Raises:
        ValueError: ``run_at`` is naive, or both ``delay`` and ``run_at`` are given.
        InvalidRequest: ``delay`` or ``timeout`` is neither a string nor a ``timedelta``.
    """
    if delay is not None and run_at is not None:
        raise ValueError("give delay or run_at, not both")
    out: dict[str, Any] = {}
    if priority is not None:
        out["priority"] = priority
    if max_attempts is not None:
        out["max_attempts"] = max_attempts
    if delay is not None:
        out["delay"] = go_duration(delay, "delay")
    if run_at is not None:
        if run_at.tzinfo is None:
            raise ValueError("run_at must be timezone-aware")
        out["run_at"] = run_at.isoformat()
    if retry is not None:
        out["retry"] = {
            k: go_duration(v, f"retry.{k}") if isinstance(v, timedelta) else v
            for k, v in retry.items()
        }
    if timeout is not None:
        out["timeout"] = go_duration(timeout, "timeout")
    return out


def go_duration(value: str | timedelta, name: str = "a duration") -> str:
    """``value`` as the API's Go duration text: a string is passed through unchanged, a
    ``timedelta`` becomes whole milliseconds when it is one (``timedelta(seconds=1.5)`` ->
    ``"1500ms"``), else microseconds (``"1500us"``), so nothing is rounded.

    Raises:
        InvalidRequest: ``value`` is neither (e.g. a number: is ``5`` seconds or
            milliseconds?); nothing was sent.
    """
    if isinstance(value, str):
        return value
    if not isinstance(value, timedelta):
        raise InvalidRequest(
            f"{name}: a timedelta or a Go duration string such as '5s', got"
            f" {type(value).__name__} {value!r}"
        )
    micros = value // timedelta(microseconds=1)
    return f"{micros // 1000}ms" if micros % 1000 == 0 else f"{micros}us"
