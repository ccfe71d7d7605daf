"""``dtq token create|list|revoke``: the API tokens in ``CRDB_DSN`` (issue 15 item 3).

``create`` prints what it made, then the secret alone on the last line of stdout (shown this
once: only its hash is stored), so a script can take ``| tail -n 1``. ``list`` never shows a
secret or a hash. Bad scopes, a bad ``--expires``, a taken or unknown name: one line on stderr,
exit status 2. The commands need the database only (no Redis); the in-memory backend of
``dtq dev`` is not reachable from another process, which is why ``dtq dev`` runs with
``API_AUTH=none``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dtq.application.tokens import MAX_LIFETIME
from dtq.domain.errors import Conflict, NotFound, ValidationError
from dtq.domain.tokens import ApiToken, parse_scopes
from dtq.entrypoints.cli.common import EXIT_OK, UsageError, cli_settings, run, say
from dtq.entrypoints.config import ConfigError, parse_duration

_DAYS = re.compile(r"([0-9]{1,5})d")


def add_parser(commands: Any, parents: Sequence[argparse.ArgumentParser]) -> None:
    """Register ``token`` and its ``create``, ``list`` and ``revoke`` subcommands."""
    parser = commands.add_parser(
        "token", help="create, list and revoke API tokens (CRDB_DSN)", parents=list(parents)
    )
    sub = parser.add_subparsers(title="token commands", metavar="ACTION", required=True)

    create = sub.add_parser(
        "create",
        help="create a token; its secret is the last line of output",
        parents=list(parents),
    )
    create.add_argument("--name", required=True, help="unique name, e.g. ci-submitter")
    create.add_argument(
        "--scopes",
        required=True,
        metavar="LIST",
        help="comma-separated: submit, read, admin, worker",
    )
    create.add_argument(
        "--expires",
        default=None,
        metavar="DURATION",
        help="lifetime, e.g. 90d, 12h, 30m (default: never expires)",
    )
    create.set_defaults(command=cmd_create)

    listing = sub.add_parser(
        "list", help="list tokens (never their secrets)", parents=list(parents)
    )
    listing.set_defaults(command=cmd_list)

    revoke = sub.add_parser("revoke", help="revoke a token by name", parents=list(parents))
    revoke.add_argument("name", help="the token's name")
    revoke.set_defaults(command=cmd_revoke)


def parse_lifetime(text: str) -> float:
    """``90d`` (days) or a Go duration (``12h``, ``1h30m``) -> seconds.

    Raises:
        UsageError: neither, or not in (0, 3650d] (subject ``--expires``).
    """
    days = _DAYS.fullmatch(text.strip())
    try:
        seconds = int(days[1]) * 86400.0 if days else parse_duration(text, variable="--expires")
    except ConfigError:
        raise UsageError(
            "--expires", f"not a duration: {text!r} (use e.g. 90d, 12h, 30m)"
        ) from None
    if not 0 < seconds <= MAX_LIFETIME:
        raise UsageError("--expires", f"must be positive and at most 3650d, got {text!r}")
    return seconds


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _scopes(token: ApiToken) -> str:
    return ",".join(sorted(scope.value for scope in token.scopes))


def cmd_create(args: argparse.Namespace) -> int:
    """Create the token; the secret is the last stdout line."""
    from dtq.entrypoints.container import open_token_service

    try:
        scopes = parse_scopes(args.scopes)
    except ValidationError as exc:
        raise UsageError("--scopes", exc.detail) from None
    lifetime = None if args.expires is None else parse_lifetime(args.expires)
    settings = cli_settings(args)
    settings.require_dsn()

    async def create() -> int:
        async with open_token_service(settings) as tokens:
            try:
                created = await tokens.create(args.name, scopes, expires_in=lifetime)
            except (ValidationError, Conflict) as exc:
                if exc.field == "expires":
                    raise UsageError("--expires", exc.detail) from None
                raise UsageError("--name", exc.detail) from None
        token = created.token
        say(f"token: created {token.name!r} with scopes {_scopes(token)}")
        say(f"token: expires {_when(token.expires_at) if token.expires_at else 'never'}")
        say("token: the secret follows; it is shown only now (send it as Authorization: Bearer)")
        say(created.secret)
        return EXIT_OK

    return run(create())


def cmd_list(args: argparse.Namespace) -> int:
    """One line per token: name, scopes, created, expires, revoked (UTC; ``-`` for none)."""
    from dtq.entrypoints.container import open_token_service

    settings = cli_settings(args)
    settings.require_dsn()

    async def listing() -> int:
        async with open_token_service(settings) as tokens:
            found = await tokens.list_tokens()
        rows = [("NAME", "SCOPES", "CREATED", "EXPIRES", "REVOKED")]
        rows += [
            (t.name, _scopes(t), _when(t.created_at), _when(t.expires_at), _when(t.revoked_at))
            for t in found
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            say(
                "  ".join(
                    cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                ).rstrip()
            )
        return EXIT_OK

    return run(listing())


def cmd_revoke(args: argparse.Namespace) -> int:
    """Revoke by name (a second revoke says so and changes nothing)."""
    from dtq.entrypoints.container import open_token_service

    settings = cli_settings(args)
    settings.require_dsn()

    async def revoke() -> int:
        async with open_token_service(settings) as tokens:
            try:
                revoked = await tokens.revoke(args.name)
            except NotFound as exc:
                raise UsageError("name", exc.detail) from None
        when = _when(revoked.token.revoked_at)
        if revoked.newly:
            say(f"token: revoked {revoked.token.name!r} at {when} (refused within 1 s)")
        else:
            say(f"token: {revoked.token.name!r} was already revoked at {when}")
        return EXIT_OK

    return run(revoke())
