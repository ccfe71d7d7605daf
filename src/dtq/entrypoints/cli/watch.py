"""``dtq watch JOB_ID`` and ``dtq results JOB_ID`` (issue 15 item 5): a live terminal view of a
job, and its results."""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from dtq.client import Client
from dtq.domain.status import JobStatus, TaskStatus
from dtq.entrypoints.api.schemas import JobBody, TaskSummaryBody
from dtq.entrypoints.cli.common import EXIT_OK, fail
from dtq.entrypoints.cli.remote import (
    EXIT_JOB_FAILED,
    EXIT_WAIT_TIMEOUT,
    api_command,
    client_options,
    console,
    emit_json,
    open_client,
    positive_duration,
    short,
    table,
)

#: How many of the latest failed tasks the view lists.
FAILURES_SHOWN = 5

#: Seconds the event stream's reader waits for a line before it reconnects (and checks whether
#: it should stop): the stream sends at least a keep-alive comment every 15 s.
STREAM_READ_TIMEOUT = 2.0


class EventWake:
    """Wakes ``follow`` early when the job's event stream (``GET /v1/events?job_id=``, issue
    16 item 1) delivers an event, so the view is redrawn at once instead of at the next
    ``--interval``. Best effort: a thread reads the stream and reconnects after the last event
    it saw; when the orchestrator has no stream (or refuses it) the thread ends and ``follow``
    keeps looking every ``--interval``, as it always does.
    """

    def __init__(self, client: Client, job_id: str) -> None:
        self._url = f"{client.config.url}/v1/events"
        self._headers = client.config.headers()
        self._job_id = job_id
        self._event = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="dtq-watch-events", daemon=True)
        self._thread.start()

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, less when an event arrives."""
        self._event.wait(seconds)
        self._event.clear()

    def close(self) -> None:
        """Stop reading (within ``STREAM_READ_TIMEOUT``)."""
        self._stop.set()
        self._thread.join(STREAM_READ_TIMEOUT + 1.0)

    def _read(self) -> None:
        last_id: str | None = None
        timeout = httpx.Timeout(10.0, read=STREAM_READ_TIMEOUT)
        while not self._stop.is_set():
            headers = dict(self._headers, **({"Last-Event-ID": last_id} if last_id else {}))
            try:
                with httpx.stream(
                    "GET",
                    self._url,
                    params={"job_id": self._job_id},
                    headers=headers,
                    timeout=timeout,
                ) as response:
                    if response.status_code != 200:
                        return  # no stream here: interval polling only
                    for line in response.iter_lines():
                        if line.startswith("id: "):
                            last_id = line[4:]
                            self._event.set()
                        if self._stop.is_set():
                            return
            except httpx.TimeoutException:
                continue  # quiet: reconnect after the last event seen
            except httpx.HTTPError:
                return


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``watch`` and ``results``."""
    parents = [*parents, client_options()]
    watch = commands.add_parser(
        "watch",
        help="follow a job live: progress, counts per status, latest failures",
        parents=parents,
    )
    watch.add_argument("job_id", metavar="JOB_ID")
    watch.add_argument(
        "--interval",
        default="1s",
        metavar="DURATION",
        help="time between two looks (Go duration, default 1s)",
    )
    watch.set_defaults(command=cmd_watch)
    results = commands.add_parser("results", help="a job's results", parents=parents)
    results.add_argument("job_id", metavar="JOB_ID")
    results.set_defaults(command=cmd_results)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the watch view shows of a job at one look."""

    job_id: str
    name: str
    status: JobStatus
    counts: dict[str, int]
    failures: list[tuple[str, str, int, str]]  # name, kind, attempt, last error

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(n for status, n in self.counts.items() if TaskStatus(status).terminal)

    @classmethod
    def of(cls, job: JobBody, failed: Sequence[TaskSummaryBody]) -> Snapshot:
        """The snapshot of a job read with its counts and its latest failed tasks."""
        return cls(
            job_id=str(job.id),
            name=job.name,
            status=job.status,
            counts={str(s): job.counts.get(str(s), 0) for s in TaskStatus},
            failures=[(t.name, t.kind, t.attempt, t.last_error or "") for t in failed],
        )

    @property
    def done(self) -> bool:
        """The job is terminal and none of its tasks is still running or waiting (a job fails
        as soon as one task fails, while others may still run)."""
        return self.status.terminal and self.finished == self.total

    def exit_status(self) -> int:
        """0 for a completed job, :data:`EXIT_JOB_FAILED` for a failed or cancelled one."""
        return EXIT_OK if self.status is JobStatus.COMPLETED else EXIT_JOB_FAILED


def render(snap: Snapshot) -> RenderableType:
    """The watch view of one snapshot."""
    style = {"completed": "green", "failed": "red", "cancelled": "yellow"}.get(str(snap.status))
    header = Text.assemble(
        ("job ", "bold"),
        snap.job_id,
        f"  {snap.name}  " if snap.name else "  ",
        (str(snap.status), style or "cyan"),
    )
    bar = ProgressBar(total=max(snap.total, 1), completed=snap.finished, width=50)
    progress = Text(f"{snap.finished}/{snap.total} tasks finished")
    counts = table(None, [str(s) for s in TaskStatus], [[snap.counts[str(s)] for s in TaskStatus]])
    line = Table.grid(padding=(0, 1))
    line.add_row(bar, progress)
    parts: list[RenderableType] = [header, line, counts]
    if snap.failures:
        parts.append(
            table(
                f"failed tasks (up to {FAILURES_SHOWN})",
                ["task", "kind", "attempt", "error"],
                [(n, k, a, short(e)) for n, k, a, e in snap.failures],
            )
        )
    return Group(*parts)


def look(client: Client, job_id: str) -> Snapshot:
    """One look at the job: its counts (``GET /v1/jobs/{id}?limit=1``) and its latest failures
    (one page of ``GET /v1/tasks?job_id=&status=failed``), so a 10,000-task job costs two small
    reads."""
    job = client.get_job(job_id, limit=1)
    failed = []
    if job.counts.get(str(TaskStatus.FAILED)):
        failed = list(
            itertools.islice(
                client.list_tasks(job_id=job_id, status="failed", page_size=FAILURES_SHOWN),
                FAILURES_SHOWN,
            )
        )
    return Snapshot.of(job, failed)


@api_command
def cmd_watch(args: argparse.Namespace) -> int:
    """Redraw the view every ``--interval`` until the job is terminal; its exit status says how
    it ended (0 completed, 1 failed or cancelled)."""
    interval = positive_duration(args.interval, option="--interval")
    with open_client(args) as client:
        return follow(client, args.job_id, as_json=args.json, interval=interval)


def follow(
    client: Client,
    job_id: str,
    *,
    as_json: bool,
    interval: float,
    timeout: float | None = None,
) -> int:
    """Look at the job every ``interval`` seconds until it is done (:attr:`Snapshot.done`),
    showing the live view (or, with ``as_json``, printing only the final snapshot as JSON).
    Each event of the job's event stream brings the next look forward (:class:`EventWake`).

    Returns:
        0 completed, :data:`EXIT_JOB_FAILED` failed or cancelled, :data:`EXIT_WAIT_TIMEOUT`
        when ``timeout`` seconds passed first (a one-line message on stderr).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    snap = look(client, job_id)
    live = None if as_json else Live(render(snap), console=console(), refresh_per_second=4)
    wake = None if snap.done else EventWake(client, job_id)
    try:
        if live is not None:
            live.start()
        while not snap.done:
            left = interval if deadline is None else deadline - time.monotonic()
            if left <= 0:
                fail(f"job {job_id} still {snap.status} after {timeout:g}s")
                return EXIT_WAIT_TIMEOUT
            assert wake is not None
            wake.wait(min(interval, left))
            snap = look(client, job_id)
            if live is not None:
                live.update(render(snap))
    finally:
        if wake is not None:
            wake.close()
        if live is not None:
            live.stop()
            if not live.console.is_terminal:  # rich ends the view with a newline on a tty only
                live.console.line()
    if as_json:
        emit_json(snap_json(snap))
    return snap.exit_status()


def snap_json(snap: Snapshot) -> dict[str, Any]:
    """The final snapshot as ``--json`` prints it."""
    return {
        "job_id": snap.job_id,
        "status": str(snap.status),
        "counts": snap.counts,
        "failures": [
            {"name": n, "kind": k, "attempt": a, "error": e} for n, k, a, e in snap.failures
        ],
    }


@api_command
def cmd_results(args: argparse.Namespace) -> int:
    """Print every task result of the job in submission order: a completed task's result as
    JSON (``null`` when its handler returned None), an empty cell for any other task."""
    with open_client(args) as client:
        results = list(client.iter_results(args.job_id))
    if args.json:
        emit_json(results)
    else:
        rows = [
            (r.name, r.task_id, r.status, short(_result(r.status, r.result), 100)) for r in results
        ]
        console().print(table(None, ["task", "task_id", "status", "result"], rows))
    return EXIT_OK


def _result(status: TaskStatus, value: Any) -> str:
    if status != TaskStatus.COMPLETED:
        return ""  # no result (yet): the API sends null for every task not completed
    return msgspec.json.encode(value).decode()
