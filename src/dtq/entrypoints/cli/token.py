"""``dtq token create|list|revoke``: the API tokens in ``CRDB_DSN`` (issue 15 item 3).

``create`` prints what it made, then the secret alone on the last line of stdout (shown this
once: only its hash is stored), so a script can take ``| tail -n 1``. ``list`` prints a table
(``--json``: a JSON array) and never shows a secret or a hash. Bad scopes, a bad ``--expires``, a
taken or unknown name: one line on stderr, exit status 2. The commands need the database only
(no Redis); the in-memory backend of ``dtq dev`` is not reachable from another process, which is
why ``dtq dev`` runs with ``API_AUTH=none``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from dtq.application.tokens import MAX_LIFETIME
from dtq.domain.errors import Conflict, NotFound, ValidationError
from dtq.domain.tokens import ApiToken, parse_scopes
from dtq.entrypoints.cli.common import EXIT_OK, UsageError, cli_settings, run, say
from dtq.entrypoints.cli.remote import console, emit_json, table
from dtq.entrypoints.config import ConfigError
from dtq.entrypoints.config_values import exact_duration

#: Shortest ``--expires``, in seconds: a shorter-lived token would be expired by the time it is
#: printed.
MIN_LIFETIME = 1
_DAYS = re.compile(r"([0-9]+)d")
_BOUNDS = "must be at least 1s and at most 3650d"


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
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(command=cmd_list)

    revoke = sub.add_parser("revoke", help="revoke a token by name", parents=list(parents))
    revoke.add_argument("name", metavar="NAME", help="the token's name")
    revoke.set_defaults(command=cmd_revoke)


def parse_lifetime(text: str) -> float:
    """``90d`` (days) or a Go duration (``12h``, ``1h30m``) -> seconds.

    Raises:
        UsageError: neither, or not from 1s (:data:`MIN_LIFETIME`) to 3650d
            (``MAX_LIFETIME``), saying so (subject ``--expires``).
    """
    days = _DAYS.fullmatch(text.strip())
    try:
        seconds = Fraction(days[1]) * 86400 if days else exact_duration(text, variable="--expires")
    except ConfigError:
        raise UsageError(
            "--expires", f"not a duration: {text!r} (use e.g. 90d, 12h, 30m)"
        ) from None
    except ValueError:  # more digits than Python turns into a number: far past the limit
        raise UsageError("--expires", f"{_BOUNDS}, got {len(text)} characters") from None
    if not MIN_LIFETIME <= seconds <= MAX_LIFETIME:
        raise UsageError("--expires", f"{_BOUNDS}, got {text!r}")
    return float(seconds)


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _at(at: datetime | None) -> str | None:
    return None if at is None else _when(at)


def _utc(at: datetime | None) -> datetime | None:
    return None if at is None else at.astimezone(UTC)


def _scopes(token: ApiToken) -> str:
    return ",".join(sorted(scope.value for scope in token.scopes))


def _token_json(token: ApiToken) -> dict[str, Any]:
    return {
        "name": token.name,
        "scopes": sorted(scope.value for scope in token.scopes),
        "created_at": _utc(token.created_at),
        "expires_at": _utc(token.expires_at),
        "revoked_at": _utc(token.revoked_at),
    }


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
    """A table row per token, by name: name, scopes, created, expires, revoked (UTC to the
    second; an empty cell for none); ``--json``: an array of ``{name, scopes, created_at,
    expires_at, revoked_at}`` (RFC 3339 UTC times, null for none)."""
    from dtq.entrypoints.container import open_token_service

    settings = cli_settings(args)
    settings.require_dsn()

    async def listing() -> int:
        async with open_token_service(settings) as tokens:
            found = await tokens.list_tokens()
        if args.json:
            emit_json([_token_json(t) for t in found])
            return EXIT_OK
        rows = [
            (t.name, _scopes(t), _when(t.created_at), _at(t.expires_at), _at(t.revoked_at))
            for t in found
        ]
        console().print(table(None, ["name", "scopes", "created", "expires", "revoked"], rows))
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
                raise UsageError("token revoke", exc.detail) from None
        when = _when(revoked.token.revoked_at)
        if revoked.newly:
            say(f"token: revoked {revoked.token.name!r} at {when} (refused within 1 s)")
        else:
            say(f"token: {revoked.token.name!r} was already revoked at {when}")
        return EXIT_OK

    return run(revoke())
