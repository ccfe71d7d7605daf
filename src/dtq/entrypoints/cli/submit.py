"""``dtq submit KIND`` and ``dtq job submit FILE.json`` (issue 15 item 5): submit over the API,
optionally waiting for the job to finish."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dtq.client import BadRequest
from dtq.entrypoints.cli.common import UsageError, fail, positive_int
from dtq.entrypoints.cli.remote import (
    api_command,
    client_options,
    console,
    emit_json,
    idempotency_key,
    json_argument,
    json_file,
    open_client,
    positive_duration,
    table,
)
from dtq.entrypoints.cli.watch import follow

#: How long ``--wait`` follows the job when ``--timeout`` is not given.
DEFAULT_WAIT_TIMEOUT = "1h"


#: ``--idempotency-key``'s help.
_KEY_HELP = (
    "the Idempotency-Key: a replay with the same body returns the first job"
    " (default: a fresh key per call, kept across its retries)"
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``submit`` and ``job submit``."""
    parents = [*parents, client_options()]
    submit = commands.add_parser("submit", help="submit one task", parents=parents)
    submit.add_argument("kind", metavar="KIND")
    submit.add_argument(
        "--payload", metavar="JSON|@FILE", help="the task's payload (JSON text or @file)"
    )
    submit.add_argument("--priority", metavar="P", help="priority tier (default: default)")
    submit.add_argument("--delay", metavar="DURATION", help="run no sooner than this (e.g. 5s)")
    submit.add_argument("--max-attempts", type=positive_int, metavar="N")
    submit.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help=_KEY_HELP,
    )
    _wait_options(submit)
    submit.set_defaults(command=cmd_submit)

    job = commands.add_parser("job", help="job commands")
    job_commands = job.add_subparsers(title="job commands", metavar="COMMAND", required=True)
    job_submit = job_commands.add_parser(
        "submit", help="submit a job from a JSON file (the POST /v1/jobs body)", parents=parents
    )
    job_submit.add_argument("file", metavar="FILE.json", help="the job body; - for stdin")
    job_submit.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help=_KEY_HELP,
    )
    _wait_options(job_submit)
    job_submit.set_defaults(command=cmd_job_submit)


def _wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait", action="store_true", help="follow the job until it finishes (as dtq watch)"
    )
    parser.add_argument(
        "--timeout",
        metavar="DURATION",
        help=f"with --wait: give up after this long, exit 124 (default {DEFAULT_WAIT_TIMEOUT})",
    )


def _wait_timeout(args: argparse.Namespace) -> float:
    """``--timeout`` in seconds (:data:`DEFAULT_WAIT_TIMEOUT` when not given).

    Raises:
        UsageError: ``--timeout`` without ``--wait`` (it would be ignored), or zero.
        ConfigError: not a Go duration.
    """
    if args.timeout is not None and not args.wait:
        raise UsageError("--timeout", "needs --wait (it is how long to wait)")
    given = DEFAULT_WAIT_TIMEOUT if args.timeout is None else args.timeout
    return positive_duration(given, option="--timeout")


@api_command
def cmd_submit(args: argparse.Namespace) -> int:
    """Submit the task; print its ids (and, with ``--wait``, follow its job)."""
    payload = None if args.payload is None else json_argument(args.payload, option="--payload")
    key = idempotency_key(args.idempotency_key)
    timeout = _wait_timeout(args)
    with open_client(args) as client:
        created = client.submit_task(
            args.kind,
            payload,
            priority=args.priority,
            delay=args.delay,
            max_attempts=args.max_attempts,
            idempotency_key=key,
        )
        if not args.wait:
            _print_ids(args, created, [("task_id", created.task_id), ("job_id", created.job_id)])
            return 0
        warn(created)
        return follow(client, str(created.job_id), as_json=args.json, interval=0.5, timeout=timeout)


@api_command
def cmd_job_submit(args: argparse.Namespace) -> int:
    """Submit the job file; print the job id and task ids by name.

    Raises:
        UsageError: the file cannot be read, is not a JSON object, or the API refused the body
            it holds (a 400, 413, 415 or 422 other than about ``--idempotency-key``:
            ``<file>: <code>: <message> (field <path>)``), naming the file as given (``stdin``
            for ``-``); or ``--idempotency-key`` is one the API would refuse (nothing is sent).
    """
    source = "stdin" if args.file == "-" else args.file
    body = json_file(args.file)
    key = idempotency_key(args.idempotency_key)
    timeout = _wait_timeout(args)
    if not isinstance(body, dict):
        raise UsageError(source, "must hold a JSON object (the POST /v1/jobs body)")
    with open_client(args) as client:
        try:
            created = client.submit_job(body, idempotency_key=key)
        except BadRequest as exc:
            if exc.field == "Idempotency-Key":  # the option's fault, not the file's
                raise
            raise UsageError(source, str(exc)) from None
        if not args.wait:
            rows = [("job_id", created.job_id), *sorted(created.tasks.items())]
            _print_ids(args, created, rows)
            return 0
        warn(created)
        return follow(client, str(created.job_id), as_json=args.json, interval=0.5, timeout=timeout)


def _print_ids(args: argparse.Namespace, created: Any, rows: list[tuple[str, Any]]) -> None:
    """The ids as JSON (``warnings`` in it), or as a table with each warning on stderr."""
    if args.json:
        emit_json(created)
        return
    console().print(table(None, ["name", "id"], rows))
    warn(created)


def warn(created: Any) -> None:
    """Each submit warning of ``created`` as one line on stderr: ``dtq: warning: code: message``."""
    for warning in created.warnings or ():
        fail(f"warning: {warning.code}: {warning.message}")
