"""``dtq tasks list``, ``dtq retry``, ``dtq cancel`` and ``dtq explain`` (issue 15 item 5): the
control and listing routes of issue 14 from the command line."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from typing import Any

from rich.text import Text

from dtq.entrypoints.cli.common import EXIT_OK, positive_int
from dtq.entrypoints.cli.remote import (
    api_command,
    client_options,
    console,
    emit_json,
    open_client,
    short,
    table,
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``tasks list``, ``retry``, ``cancel`` and ``explain``."""
    parents = [*parents, client_options()]
    tasks = commands.add_parser("tasks", help="task commands")
    task_commands = tasks.add_subparsers(title="task commands", metavar="COMMAND", required=True)
    listing = task_commands.add_parser(
        "list", help="list tasks, newest first (GET /v1/tasks)", parents=parents
    )
    listing.add_argument(
        "--status", action="append", metavar="S", help="failed, queued, … (repeatable)"
    )
    listing.add_argument("--kind", metavar="K")
    listing.add_argument("--job", dest="job_id", metavar="JOB_ID")
    listing.add_argument("--priority", metavar="P")
    listing.add_argument(
        "--limit", type=positive_int, default=50, metavar="N", help="most rows (default 50)"
    )
    listing.set_defaults(command=cmd_tasks_list)

    retry = commands.add_parser(
        "retry", help="run a failed or cancelled task again", parents=parents
    )
    retry.add_argument("task_id", metavar="TASK_ID")
    retry.set_defaults(command=cmd_retry)

    cancel = commands.add_parser(
        "cancel", help="cancel a job (or with --task, one task)", parents=parents
    )
    cancel.add_argument("id", metavar="JOB_ID")
    cancel.add_argument("--task", action="store_true", help="the id is a task's: cancel that task")
    cancel.set_defaults(command=cmd_cancel)

    explain = commands.add_parser("explain", help="why a task is (not) running", parents=parents)
    explain.add_argument("task_id", metavar="TASK_ID")
    explain.set_defaults(command=cmd_explain)


@api_command
def cmd_tasks_list(args: argparse.Namespace) -> int:
    """Print up to ``--limit`` matching tasks."""
    with open_client(args) as client:
        found = list(
            itertools.islice(
                client.list_tasks(
                    status=args.status,
                    kind=args.kind,
                    job_id=args.job_id,
                    priority=args.priority,
                    page_size=min(args.limit, 500),
                ),
                args.limit,
            )
        )
    if args.json:
        emit_json(found)
        return EXIT_OK
    rows = [
        (t.id, t.name, t.kind, t.status, f"{t.attempt}/{t.max_attempts}", short(t.last_error, 60))
        for t in found
    ]
    console().print(table(None, ["task_id", "name", "kind", "status", "attempt", "error"], rows))
    return EXIT_OK


@api_command
def cmd_retry(args: argparse.Namespace) -> int:
    """Retry the task; print its new status and how many dependents were reopened."""
    with open_client(args) as client:
        done = client.retry_task(args.task_id)
    if args.json:
        emit_json(done)
    else:
        rows = [("task_id", done.task_id), ("status", done.status), ("reopened", done.reopened)]
        console().print(table(None, ["", ""], rows))
    return EXIT_OK


@api_command
def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel the job (or the task); print the outcome."""
    with open_client(args) as client:
        if args.task:
            task = client.cancel_task(args.id)
            value: Any = task
            rows = [("task_id", task.task_id), ("status", task.status), ("cascaded", task.cascaded)]
        else:
            job = client.cancel_job(args.id)
            value = job
            rows = [("job_id", job.job_id), ("status", job.status), ("cancelled", job.cancelled)]
    if args.json:
        emit_json(value)
    else:
        console().print(table(None, ["", ""], rows))
    return EXIT_OK


def explain_line(reason: str, status: str, message: str) -> Text:
    """The first line ``dtq explain`` prints: the reason code in bold, the status in brackets
    when it is not the same word, then the message without a leading repeat of the code
    (``scheduled: due at ...`` and ``running on worker ...`` start with it)."""
    if status == reason:
        head = ""
        message = message.removeprefix(f"{reason}: ").removeprefix(f"{reason} ")
    else:
        head = f" ({status})"
        message = message.removeprefix(f"{reason}: ")
    return Text.assemble((reason, "bold"), f"{head}: {message}")


@api_command
def cmd_explain(args: argparse.Namespace) -> int:
    """Print the task's reason code, status, message (:func:`explain_line`) and details."""
    with open_client(args) as client:
        why = client.explain(args.task_id)
    if args.json:
        emit_json(why)
    else:
        out = console()
        # the message is data (an error text), never markup
        out.print(explain_line(why.reason, why.status, why.message), highlight=False)
        if why.details:
            out.print(table(None, ["detail", "value"], sorted(why.details.items())))
    return EXIT_OK
