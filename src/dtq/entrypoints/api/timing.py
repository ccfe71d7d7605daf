"""Parsing the submit body's timing fields: ``run_at``, ``delay`` (issue 14 item 2), ``retry``
and ``timeout`` (item 3).

Both are kept as text in the request Structs (so a naive time or a malformed duration is a
400 naming the field, in our words) and turned into aware/positive Python values here.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from dtq.domain.errors import ValidationError
from dtq.domain.policy import RetryPolicy
from dtq.entrypoints.api.schemas import RetryRequest
from dtq.entrypoints.config_values import ConfigError, exact_duration, parse_duration

#: The longest ``delay`` accepted: one year.
MAX_DELAY = timedelta(days=366)

#: The earliest ``run_at`` accepted. A past time runs now, but one before this is a typo (a
#: year 0001 or 1970 left in by mistake), not a plan; a fixed bound answers the same body the
#: same way on every replay.
EARLIEST_RUN_AT = datetime(2000, 1, 1, tzinfo=UTC)


#: RFC 3339's date-time (section 5.6; ``T`` and ``Z`` in either case, a fraction of any length,
#: cut to microseconds), the offset optional here so that a naive time gets its own message.
RFC_3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:(?P<second>[0-9]{2})(?:\.[0-9]+)?"
    r"(?P<offset>[Zz]|[+-][0-9]{2}:[0-9]{2})?"
)


def parse_run_at(text: str, *, field: str, now: datetime | None = None) -> datetime:
    """Parse an RFC 3339 time with an offset (``2026-12-01T12:00:00Z``, ``...+02:00``); other
    ISO 8601 forms (``+0200``, week dates, no seconds, a comma) are refused.

    Args:
        text: the field's text.
        field: the field named in errors.
        now: the current time (default: the host's clock); ``run_at`` may be at most
            :data:`MAX_DELAY` after it, like ``delay``.

    Returns:
        The aware time in UTC.

    Raises:
        ValidationError: not an RFC 3339 time (a leap second included), no offset (a naive time
            is ambiguous), before :data:`EARLIEST_RUN_AT`, or more than :data:`MAX_DELAY` ahead.
    """
    shape = RFC_3339.fullmatch(text)
    if shape is None:
        raise _not_rfc_3339(text, field)
    if shape["offset"] is None:
        raise ValidationError(
            f"run_at needs a date, a time and a UTC offset (Z or +hh:mm), got {text[:64]!r}",
            field=field,
        )
    if shape["second"] == "60":
        raise ValidationError(
            f"run_at cannot be a leap second (:60), got {text[:64]!r}: use :59", field=field
        )
    try:
        value = datetime.fromisoformat(text.upper())
    except ValueError:  # a month 13, an offset of 24 hours
        raise _not_rfc_3339(text, field) from None
    now = now if now is not None else datetime.now(UTC)
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # an offset pushing 0001-01-01 or 9999-12-31 out of range
        utc = None
    if (utc is None and value.year == 1) or (utc is not None and utc < EARLIEST_RUN_AT):
        raise ValidationError(
            f"run_at must not be before {EARLIEST_RUN_AT:%Y-%m-%dT%H:%M:%SZ}, got {text[:64]!r}",
            field=field,
        )
    if utc is None or utc > now + MAX_DELAY:
        raise ValidationError(
            f"run_at must be at most {format_duration(MAX_DELAY)} ahead, got {text[:64]!r}",
            field=field,
        )
    return utc


def _not_rfc_3339(text: str, field: str) -> ValidationError:
    return ValidationError(
        f"not an RFC 3339 time: {text[:64]!r} (use e.g. 2026-12-01T12:00:00Z)", field=field
    )


#: What a task's stored durations keep: its retry delays and timeout are stored in milliseconds.
STORED_RESOLUTION = timedelta(milliseconds=1)
#: The shortest handler ``timeout``.
MIN_TIMEOUT = timedelta(milliseconds=1)


def exact_request_duration(text: str, *, field: str) -> Fraction:
    """The exact length in seconds of a Go duration a client sent (a body field or a query
    parameter): the configuration grammar, without the surrounding whitespace it forgives.

    Raises:
        ValidationError: not a Go duration (``field`` named).
    """
    try:
        # parse_duration forgives surrounding whitespace in configuration; a request may not
        if text != text.strip():
            raise ConfigError(field, "surrounding whitespace")
        parse_duration(text, variable=field)  # the grammar's own limits (hours past a float)
        return exact_duration(text, variable=field)
    except ConfigError:
        raise ValidationError(
            f"not a duration: {text[:64]!r} (use e.g. 500ms, 30s, 2m, 1h30m)", field=field
        ) from None


def parse_delay(
    text: str,
    *,
    field: str,
    minimum: timedelta = timedelta(0),
    maximum: timedelta = MAX_DELAY,
    stored: bool = False,
) -> timedelta:
    """Parse a Go duration (``500ms``, ``30s``, ``1h30m``) in ``minimum .. maximum``, both bounds
    exact (``8784h1ns`` is beyond ``8784h``, ``-1ns`` below ``0s``).

    Args:
        text: the field's text.
        field: the field named in errors.
        minimum: the shortest duration accepted.
        maximum: the longest duration accepted.
        stored: the duration is kept on the task at :data:`STORED_RESOLUTION`, so it must be a
            whole number of milliseconds (``1.5ms`` and ``1us`` would not be what is stored).

    Returns:
        The duration, to the microsecond (exact when ``stored``).

    Raises:
        ValidationError: not a Go duration (surrounding whitespace included), outside
            ``minimum .. maximum``, or (``stored``) not a whole number of milliseconds.
    """
    exact = exact_request_duration(text, field=field)
    if not _seconds(minimum) <= exact <= _seconds(maximum):
        raise ValidationError(
            f"must be between {format_duration(minimum)} and {format_duration(maximum)},"
            f" got {text[:64]!r}",
            field=field,
        )
    if stored and (exact / _seconds(STORED_RESOLUTION)).denominator != 1:
        raise ValidationError(
            f"must be a whole number of milliseconds (what is stored), got {text[:64]!r}",
            field=field,
        )
    return timedelta(microseconds=round(exact * 10**6))


def _seconds(value: timedelta) -> Fraction:
    return Fraction(value // timedelta(microseconds=1), 10**6)


def parse_retry(body: RetryRequest, *, field: str) -> RetryPolicy:
    """The domain policy of a submit's ``retry`` object (issue 14 item 3).

    Raises:
        ValidationError: a duration malformed, beyond a year or not a whole number of
            milliseconds (``{field}.delay`` / ``{field}.max_delay``), ``max_delay`` below
            ``delay``, or ``max_delay`` with fixed backoff (it would do nothing).
    """
    delay = None
    if isinstance(body.delay, str):
        delay = parse_delay(body.delay, field=f"{field}.delay", stored=True)
    cap = None
    if isinstance(body.max_delay, str):
        cap = parse_delay(body.max_delay, field=f"{field}.max_delay", stored=True)
        if body.backoff != "exponential":
            raise ValidationError(
                "max_delay applies to exponential backoff only", field=f"{field}.max_delay"
            )
        if delay is not None and cap < delay:
            raise ValidationError(
                f"max_delay ({body.max_delay}) is shorter than delay ({body.delay})",
                field=f"{field}.max_delay",
            )
    return RetryPolicy(backoff=body.backoff, delay=delay, max_delay=cap, jitter=body.jitter)


def parse_timeout(text: str, *, field: str) -> timedelta:
    """A handler timeout: a Go duration from :data:`MIN_TIMEOUT` to one year, both bounds exact,
    in whole milliseconds (:func:`parse_delay`).

    Raises:
        ValidationError: malformed, outside 1ms..8784h, or not a whole number of milliseconds.
    """
    return parse_delay(text, field=field, minimum=MIN_TIMEOUT, stored=True)


def format_duration(value: timedelta) -> str:
    """A Go duration for display: ``500ms``, ``5s``, ``1m30s``, ``2h``; milliseconds resolution."""
    ms = round(value.total_seconds() * 1000)
    if ms % 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    parts.append(f"{seconds}s" if seconds or not (hours or minutes) else "")
    return "".join(parts)
