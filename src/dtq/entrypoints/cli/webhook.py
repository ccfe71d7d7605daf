"""``dtq webhook create|list|delete|deliveries`` (issue 16 item 2): the webhooks of a running
orchestrator, through ``/v1/webhooks`` (:class:`~dtq.client.Client`; ``create`` and ``delete``
need a token with the ``admin`` scope, ``list`` and ``deliveries`` one with ``read``).

``create``'s ``--url`` is the webhook's url, so there the orchestrator's is ``--api-url`` (or
``DTQ_URL``, as everywhere). Without ``--secret`` it makes one (32 random bytes, URL-safe) and
prints it alone on the last line of stdout, shown this once (``| tail -n 1``); ``--secret -``
reads it from stdin, so it stays out of the process list. A refused field (a bad ``--url``, an
unknown ``--event``, a secret of the wrong length, an id that is not a UUID) is one line on
stderr and exit 2.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Sequence
from typing import Any

from dtq.entrypoints.cli.common import EXIT_OK, UsageError, say
from dtq.entrypoints.cli.remote import (
    api_command,
    client_options,
    console,
    emit_json,
    open_client,
    table,
)


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``webhook`` and its ``create``, ``list``, ``delete`` and ``deliveries``."""
    parser = commands.add_parser(
        "webhook",
        help="create, list and delete webhooks; read their delivery logs",
        parents=list(parents),
    )
    parents = [*parents, client_options()]
    sub = parser.add_subparsers(title="webhook commands", metavar="ACTION", required=True)

    create = sub.add_parser(
        "create",
        help="POST matching events to a url (admin scope)",
        parents=[*parents[:-1], client_options("--api-url")],
    )
    create.add_argument(
        "--url",
        dest="target",
        metavar="URL",
        required=True,
        help="http:// or https:// url to POST to",
    )
    create.add_argument(
        "--event",
        dest="events",
        action="append",
        required=True,
        metavar="TYPE",
        help="event type to deliver, e.g. job.completed (repeatable, or comma-separated)",
    )
    create.add_argument(
        "--secret",
        metavar="SECRET",
        help="16..256 characters that sign each delivery; '-' reads it from stdin"
        " (default: a new random one, printed last)",
    )
    create.set_defaults(command=cmd_create)

    listing = sub.add_parser("list", help="list the webhooks (never a secret)", parents=parents)
    listing.set_defaults(command=cmd_list)

    remove = sub.add_parser("delete", help="delete a webhook (admin scope)", parents=parents)
    remove.add_argument("webhook_id", metavar="ID")
    remove.set_defaults(command=cmd_delete)

    log = sub.add_parser(
        "deliveries", help="a webhook's delivery log: position, last try", parents=parents
    )
    log.add_argument("webhook_id", metavar="ID")
    log.set_defaults(command=cmd_deliveries)


def event_types(values: Sequence[str]) -> list[str]:
    """The ``--event`` values, comma-separated ones split, in order, without repeats.

    Raises:
        UsageError: nothing but commas and spaces.
    """
    found = [part.strip() for value in values for part in value.split(",") if part.strip()]
    if not found:
        raise UsageError("--event", "name at least one event type, e.g. job.completed")
    return list(dict.fromkeys(found))


def _secret(given: str | None) -> tuple[str, bool]:
    """The secret to send and whether it was generated here (then it is printed)."""
    if given is None:
        return secrets.token_urlsafe(32), True
    if given == "-":
        given = sys.stdin.readline().rstrip("\r\n")
        if not given:
            raise UsageError("--secret", "stdin gave an empty line")
    return given, False


@api_command
def cmd_create(args: argparse.Namespace) -> int:
    """Create the webhook; print it (and a generated secret, last)."""
    events = event_types(args.events)
    secret, generated = _secret(args.secret)
    with open_client(args) as client:
        hook = client.create_webhook(args.target, events, secret)
    if args.json:
        emit_json({"webhook": hook, "secret": secret} if generated else hook)
        return EXIT_OK
    say(f"webhook: created {hook.id} for {', '.join(hook.events)} -> {hook.url}")
    if generated:
        say("webhook: the secret follows; it is shown only now (verify X-Dtq-Signature with it)")
        say(secret)
    return EXIT_OK


@api_command
def cmd_list(args: argparse.Namespace) -> int:
    """Print every webhook, oldest first."""
    with open_client(args) as client:
        hooks = client.list_webhooks()
    if args.json:
        emit_json(hooks)
        return EXIT_OK
    rows = [(h.id, h.url, ",".join(h.events), h.created_at.isoformat()) for h in hooks]
    console().print(table(None, ["id", "url", "events", "created"], rows))
    return EXIT_OK


@api_command
def cmd_delete(args: argparse.Namespace) -> int:
    """Delete the webhook."""
    with open_client(args) as client:
        client.delete_webhook(args.webhook_id)
    if args.json:
        emit_json({"deleted": args.webhook_id})
    else:
        say(f"webhook: deleted {args.webhook_id}")
    return EXIT_OK


@api_command
def cmd_deliveries(args: argparse.Namespace) -> int:
    """Print the webhook's delivery log."""
    with open_client(args) as client:
        log = client.webhook_deliveries(args.webhook_id)
    if args.json:
        emit_json(log)
        return EXIT_OK
    rows = [
        ("webhook_id", log.webhook_id),
        ("delivered", log.delivered),
        ("cursor", log.cursor),
        ("failures in a row", log.attempts),
        ("last status", log.last_status),
        ("last error", log.last_error),
        ("last attempt", log.last_attempt_at.isoformat() if log.last_attempt_at else None),
        ("next attempt", log.next_attempt_at.isoformat() if log.next_attempt_at else None),
    ]
    console().print(table(None, ["", ""], rows))
    return EXIT_OK
