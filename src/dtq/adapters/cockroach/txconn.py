"""``TryConnection``: the connection of one store try, whose first request carries its BEGIN.

A store try (``CockroachStore.run``) used to open with a request of its own (``BEGIN``). Here
``BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT now()`` is prepended to the try's first statement,
which is then bound on the client (a simple query of several statements takes no parameters),
so the transaction, its timestamp and the first statement's answer come back in one round trip.
A first statement that cannot be bound on the client goes as before, after the BEGIN request.

Both dialects run a multi-statement simple query in order and stop at its first error; the
statements after ``BEGIN`` run in the transaction it opened. A statement bound on the client
is sent as text the first time a connection binds it; the store then prepares it by name on
that connection (``ClientStatements``), and later tries send ``EXECUTE <name>(<literals>)``,
so the server no longer parses and plans it on every try (ARCHITECTURE.md, "SQL per use
case").

A compare-and-set on a row the try has read (``send_guarded``) is queued too, wrapped so that
it fails its own transaction when it writes no row: under SERIALIZABLE it cannot miss (a
concurrent write to the row fails the try with 40001 instead), and if it ever did, the request
that carried it raises ``ConcurrentUpdate`` and no COMMIT after it runs.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection, AsyncCursor, abc
from psycopg.adapt import Transformer
from psycopg.rows import TupleRow
from psycopg.types.numeric import Int8

from dtq.adapters.cockroach import sql
from dtq.adapters.cockroach.arrays import Int8Array, TextArray, TimestamptzArray, UuidArray
from dtq.domain.errors import ConcurrentUpdate


class Conn(Protocol):
    """What the repositories use of a connection: ``execute`` (psycopg's signature)."""

    async def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool = False
    ) -> AsyncCursor[TupleRow]:
        """Send one statement (or, without parameters, a simple query) and return its cursor."""
        ...


def bind_on_client(conn: AsyncConnection[TupleRow], query: Any, params: Any) -> str | None:
    """``query`` with ``params`` bound on the client as SQL literals, or None if they cannot be.

    A ``%b`` placeholder (a binary parameter) is bound as ``%s`` (text): the statements cast
    every array parameter (``%b::uuid[]``), so the text literal reads as the same value.

    On a pool connection (:class:`ClientStatements` as its ``statements``) a query the
    connection has prepared by name comes back as ``EXECUTE <name>(<literals>)``: the server
    runs its cached plan instead of parsing and planning the text again. A query not prepared
    yet comes back as its full text (the literals of :func:`_bound_fast`, psycopg's
    ``mogrify`` only for a mapping of parameters) and is noted for :func:`prepare_noted`.

    Raises:
        nothing: a parameter psycopg cannot render as text gives None (the caller sends the
            statement with bound parameters instead).
    """
    if not isinstance(query, str):
        return None
    if params is None:
        return query
    statements: ClientStatements | None = getattr(conn, "statements", None)
    try:
        if statements is not None and (name := statements.name_of(query)) is not None:
            return f"EXECUTE {name}({statements.literals(conn, params)})"
        bound = _bound_fast(conn, statements or ClientStatements(), query, params)
        if bound is None:
            bound = AsyncClientCursor(conn).mogrify(_PLACEHOLDER.sub(_as_text, query), params)
    except (psycopg.Error, TypeError, ValueError):
        return None
    if statements is not None:
        statements.note(query)
    return bound


#: ``%%`` (a literal percent sign, kept) or ``%b`` (a binary placeholder, bound as text).
_PLACEHOLDER = re.compile(r"%([%b])")

#: Any placeholder of a psycopg query (``%s``, ``%b``, ``%t``) or a literal ``%%``.
_ANY_PLACEHOLDER = re.compile(r"%([%sbt])")


def _as_text(match: re.Match[str]) -> str:
    return "%%" if match.group(1) == "%" else "%s"


def _bound_fast(
    conn: AsyncConnection[TupleRow], statements: ClientStatements, query: str, params: Any
) -> str | None:
    """``query`` with each placeholder replaced by its parameter's literal
    (:meth:`ClientStatements.literal_list`) and each ``%%`` by ``%``: the text psycopg's
    ``mogrify`` writes, without mogrify's array dumpers, which escape per character in Python.
    None when the parameters are not a sequence or do not match the placeholders (psycopg
    then decides, or refuses)."""
    if not isinstance(params, tuple | list):
        return None
    literals = statements.literal_list(conn, params)
    given = iter(literals)
    missing = False

    def place(match: re.Match[str]) -> str:
        nonlocal missing
        if match.group(1) == "%":
            return "%"
        literal = next(given, None)
        if literal is None:
            missing = True
            return ""
        return literal

    bound = _ANY_PLACEHOLDER.sub(place, query)
    if missing or next(given, None) is not None:
        return None
    return bound


def numbered(query: str) -> str:
    """``query`` with its psycopg placeholders numbered as the server's (``$1``, ``$2``, ...)
    and ``%%`` as ``%``: the text a ``PREPARE`` takes."""
    counter = itertools.count(1)

    def number(match: re.Match[str]) -> str:
        return "%" if match.group(1) == "%" else f"${next(counter)}"

    return _ANY_PLACEHOLDER.sub(number, query)


#: Most statements one connection prepares by name or was refused (psycopg's own cache keeps
#: as many).
MAX_PREPARED = 100
#: Losses of a prepared statement (SQLSTATE 26000) after which a process stops preparing.
MAX_LOSSES = 3
#: What a server answers when it cannot use an ``EXECUTE``'s arguments (or their count) for the
#: statement's parameters: datatype mismatch, cannot coerce, indeterminate or ambiguous
#: parameter type, syntax error (a wrong number of arguments).
_EXECUTE_REFUSED = frozenset({"42804", "42846", "42P18", "42P08", "42601"})
#: SQLSTATE 42P05: a prepared statement of that name exists on the session already.
_DUPLICATE_PREPARED = "42P05"


def _uuid_literal(value: UUID) -> str | None:
    return f"'{value.hex}'::uuid"


def _datetime_literal(value: datetime) -> str | None:
    # aware only: a naive datetime is a ``timestamp`` to psycopg, left to its dumper;
    # isoformat(" ") is str(value) without format()'s detour (~0.4 µs less per value)
    return None if value.tzinfo is None else f"'{value.isoformat(' ')}'::timestamptz"


def _str_literal(value: str) -> str | None:
    # a quote, a backslash (psycopg writes E'...') or a NUL (refused) is left to psycopg
    return None if "'" in value or "\\" in value or "\x00" in value else f"'{value}'"


def _int_literal(value: int) -> str | None:
    return str(value) if value >= 0 else None  # psycopg writes " -3": left to it


def _bool_literal(value: bool) -> str | None:
    return "true" if value else "false"


def _none_literal(value: None) -> str | None:
    return "NULL"


#: An array element psycopg writes in double quotes: empty, the word NULL in any case, a
#: character with a meaning in the array syntax, ASCII white space, or a Unicode space that
#: CockroachDB strips from unquoted elements (``psycopg.types.array``'s own rule).
_ELEMENT_NEEDS_QUOTES = re.compile(
    r'^$|["{},\\ \t\n\r\x0b\x0c\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]|^null$',
    re.IGNORECASE,
)


def _text_element(value: str) -> str:
    if _ELEMENT_NEEDS_QUOTES.search(value) is None:
        return value
    # str.replace, not a regex substitution per quote (benchmarks/PROFILE.md, eighteenth pass)
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if '"' in value:
        value = value.replace('"', '\\"')
    return '"' + value + '"'


#: :func:`_text_element` remembered for short strings (kinds, statuses, priorities and ``{}``
#: recur in every batch); a payload's text is not kept.
_short_text_element = functools.lru_cache(maxsize=1024)(_text_element)
_SHORT_TEXT = 64


def _array_literal(body: str, cast: str) -> str:
    """``{body}`` quoted as libpq's ``PQescapeLiteral`` does (``'`` doubled; with a backslash,
    ` E'...'` and every backslash doubled), then ``cast`` when some element is not NULL."""
    text = "{" + body + "}"
    if "'" in text:
        text = text.replace("'", "''")
    if "\\" in text:
        return f" E'{text.replace(chr(92), chr(92) * 2)}'{cast}"
    return f"'{text}'{cast}"


def _typed_array_literal(
    values: list[Any], element: Callable[[Any], str | None], cast: str
) -> str | None:
    parts: list[str] = []
    previous: Any = None
    text = "NULL"
    typed = False  # some element is not NULL: psycopg casts only then
    for value in values:
        if value is not previous:  # a batch's rows share one timestamp object
            rendered = "NULL" if value is None else element(value)
            if rendered is None:
                return None
            previous, text = value, rendered
            typed = typed or value is not None
        parts.append(text)
    return _array_literal(",".join(parts), cast if typed else "")


def _uuid_array_literal(values: UuidArray) -> str | None:
    return _typed_array_literal(values, lambda v: v.hex if type(v) is UUID else None, "::uuid[]")


def _timestamptz_array_literal(values: TimestamptzArray) -> str | None:
    # aware datetimes only (a naive one makes psycopg choose the timestamp dumper)
    return _typed_array_literal(
        values,
        lambda v: f'"{v.isoformat(" ")}"' if type(v) is datetime and v.tzinfo else None,
        "::timestamptz[]",
    )


def _int8_array_literal(values: Int8Array) -> str | None:
    return _typed_array_literal(
        values, lambda v: str(v) if type(v) in (int, Int8) else None, "::int8[]"
    )


def _text_array_literal(values: TextArray) -> str | None:
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        elif type(value) is not str or "\x00" in value:
            return None  # a str subclass or a NUL (refused by the server): psycopg decides
        elif len(value) <= _SHORT_TEXT:
            parts.append(_short_text_element(value))
        else:
            parts.append(_text_element(value))
    return _array_literal(",".join(parts), "")


_FAST_LITERALS: dict[type, Callable[[Any], str | None]] = {
    UuidArray: _uuid_array_literal,
    TimestamptzArray: _timestamptz_array_literal,
    Int8Array: _int8_array_literal,
    TextArray: _text_array_literal,
    UUID: _uuid_literal,
    datetime: _datetime_literal,
    str: _str_literal,
    int: _int_literal,
    Int8: _int_literal,
    bool: _bool_literal,
    type(None): _none_literal,
}


def fast_literal(value: Any) -> str | None:
    """``value`` as the SQL literal psycopg's text dumper writes for it, for a value of
    exactly one of the types of a state change (uuid, aware datetime, plain str,
    non-negative int, bool, None) or one of the typed arrays of ``arrays.py`` holding such
    values; None for anything else (the caller asks psycopg).

    The same text, without the transformer's dumper lookup per value: the literals of an
    ``EXECUTE`` are on the claim's and the submit's path (benchmarks/PROFILE.md, tenth pass).
    """
    render = _FAST_LITERALS.get(type(value))
    return None if render is None else render(value)


def statement_name(query: str) -> str:
    """The name a query is prepared under: ``dtq_`` and 16 hex digits of the SHA-256 of its
    numbered text, so a name means the same statement on every session (two connections
    that reach one server session through a pooler never run each other's statements)."""
    return "dtq_" + hashlib.sha256(numbered(query).encode()).hexdigest()[:16]


class ClientStatements:
    """The statements one pool connection has prepared by name for client-side binding.

    A statement bound on the client (a simple query carries no parameters) is parsed and
    planned by the server on every try. Once a connection has sent a query that way, the
    store prepares it on that connection between two tries (:func:`prepare_noted`, one
    ``PREPARE`` per request, outside any transaction, so its outcome is never in doubt) and
    later bindings send ``EXECUTE <name>(<literals>)`` instead (:func:`statement_name`). A
    query the server refuses to prepare is not tried again on this connection; past
    ``MAX_PREPARED`` names and refusals (the listing's filter combinations are many texts)
    further queries stay text.

    Class attribute ``enabled``: False once the server has refused an ``EXECUTE``'s arguments
    (a dialect that types them differently), or has lost ``MAX_LOSSES`` prepared statements
    (SQLSTATE 26000; e.g. a pooler that does not keep a session's prepared statements): no
    connection of this process prepares or executes by name afterwards
    (:func:`forget_prepared`).
    """

    enabled = True
    losses = 0

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._noted: dict[str, None] = {}
        self._refused: set[str] = set()
        self._transformer: abc.Transformer | None = None

    def literals(self, conn: AsyncConnection[TupleRow], params: Any) -> str:
        """:meth:`literal_list` separated by commas (an ``EXECUTE``'s arguments)."""
        return ", ".join(self.literal_list(conn, params))

    def literal_list(self, conn: AsyncConnection[TupleRow], params: Any) -> list[str]:
        """``params`` as SQL literals, each as psycopg's text dumper writes it
        (:func:`fast_literal` for the common types, the connection's transformer for the
        rest)."""
        out = []
        for param in params:
            literal = fast_literal(param)
            if literal is None:
                tx = self._transformer
                if tx is None:
                    tx = self._transformer = Transformer(conn)
                literal = tx.as_literal(param).decode(conn.info.encoding)
            out.append(literal)
        return out

    def name_of(self, query: str) -> str | None:
        """The name ``query`` is prepared under on this connection, or None."""
        return self._names.get(query) if ClientStatements.enabled else None

    def note(self, query: str) -> None:
        """Remember ``query`` (just bound as text) for the next :func:`prepare_noted`."""
        if not ClientStatements.enabled or query in self._refused:
            return
        if len(self._names) + len(self._noted) + len(self._refused) < MAX_PREPARED:
            self._noted[query] = None

    @property
    def noted(self) -> bool:
        """Whether some query waits to be prepared."""
        return bool(self._noted)

    async def prepare_noted(self, conn: AsyncConnection[TupleRow]) -> None:
        """Prepare every noted query on ``conn`` (autocommit, no transaction open), one
        ``PREPARE`` per request. A name the session has already (SQLSTATE 42P05) is the same
        statement (:func:`statement_name`) and is used; a query the server refuses otherwise
        is not tried again.

        Raises:
            psycopg.Error: the connection was lost (nothing more is prepared).
        """
        noted, self._noted = list(self._noted), {}
        if not ClientStatements.enabled:
            return
        for query in noted:
            name = statement_name(query)
            try:
                await conn.execute(f"PREPARE {name} AS {numbered(query)}", prepare=False)
            except psycopg.Error as exc:
                if conn.closed or conn.broken:
                    raise
                if exc.sqlstate != _DUPLICATE_PREPARED:
                    self._refused.add(query)
                    continue
            self._names[query] = name

    def forget(self) -> None:
        """Drop every name (the server no longer has them)."""
        self._names.clear()
        self._noted.clear()


async def prepare_noted(conn: AsyncConnection[TupleRow]) -> None:
    """Prepare the queries ``conn`` has bound as text since the last call (see
    :class:`ClientStatements`); nothing for a connection without ``statements``.

    Raises:
        psycopg.Error: the connection was lost.
    """
    statements: ClientStatements | None = getattr(conn, "statements", None)
    if statements is not None and statements.noted:
        await statements.prepare_noted(conn)


def prepared_failed(exc: psycopg.Error, by_name: bool) -> bool:
    """Whether ``exc`` says a statement prepared by :class:`ClientStatements` cannot be used:
    SQLSTATE 26000 for a ``dtq_`` name (psycopg's own are ``_pg3_<n>``), or, from a try that
    executed some by name (``by_name``), the server's refusal of an ``EXECUTE``'s arguments
    (the same statement as text is never refused that way, or it would fail on every try)."""
    state = exc.sqlstate or ""
    if state == "26000":
        return '"dtq_' in str(exc)
    return by_name and state in _EXECUTE_REFUSED


def forget_prepared(conn: AsyncConnection[TupleRow] | None, exc: psycopg.Error) -> None:
    """After :func:`prepared_failed`: drop ``conn``'s names; stop preparing and executing by
    name in this process (``ClientStatements.enabled``) after a refused ``EXECUTE`` or the
    ``MAX_LOSSES``-th lost statement."""
    statements: ClientStatements | None = getattr(conn, "statements", None)
    if statements is not None:
        statements.forget()
    if exc.sqlstate == "26000":
        ClientStatements.losses += 1
        if ClientStatements.losses < MAX_LOSSES:
            return
    ClientStatements.enabled = False


#: How far before its transaction's ``now()`` an estimated timestamp may lie (ClockAnchor).
ESTIMATE_TOLERANCE = timedelta(milliseconds=100)
#: The oldest reading of the database clock an estimate is made from, in seconds.
ANCHOR_MAX_AGE = 30.0
#: The longest request (send to answer, in seconds) whose reading of the clock is kept: the
#: reading lags the server's clock by up to that much.
READING_MAX_WAIT = 0.005
#: Refusals in a row after which a process stops estimating for a while.
MAX_REFUSALS = 3
#: How long a process makes no estimate after ``MAX_REFUSALS`` refusals in a row, in seconds.
ESTIMATES_OFF_FOR = 60.0


class EstimateRefused(Exception):
    """The database found a try's estimated timestamp outside ``[now() - ESTIMATE_TOLERANCE,
    now()]``; nothing after the check ran. The connection's reading is forgotten, so a re-run
    on that connection reads the clock."""


class ClockAnchor:
    """The database clock as one pool connection last read it, and when (this process's
    monotonic clock): the base of :meth:`TryConnection.estimate_now`.

    A try's BEGIN brings its ``now()``; a request answered within ``READING_MAX_WAIT`` keeps
    it as the connection's reading (:meth:`know`), and the next try on the connection can then
    stamp its new rows with the reading plus the time elapsed since, without the round trip a
    reading costs. Taken when the answer arrives, the estimate lags the server's clock by the
    time between the server's reading and that arrival (at most ``READING_MAX_WAIT``) plus
    the time between the estimate and the server's running of the next request; the database
    checks it (within the try, before anything is committed) and refuses one that is ahead or
    more than ``ESTIMATE_TOLERANCE`` behind. Per connection: on CockroachDB each connection
    has its gateway node, whose clock may differ from another node's.

    Class attributes: ``refusals`` counts the refusals since an estimate was last accepted;
    the ``MAX_REFUSALS``-th in a row (a clock stepped back; a CockroachDB node whose hybrid
    clock runs ahead of its wall clock; an event loop stalled past the tolerance) turns
    estimates off for every connection of the process until the monotonic time
    ``off_until``, ``ESTIMATES_OFF_FOR`` seconds later.
    """

    refusals = 0
    off_until = 0.0

    __slots__ = ("_at", "_now")

    def __init__(self) -> None:
        self._now: datetime | None = None
        self._at = 0.0

    def know(self, now: datetime, waited: float = 0.0) -> None:
        """Keep ``now`` (a transaction timestamp whose request took ``waited`` seconds from
        send to answer, just received) as the reading, unless ``waited`` exceeds
        ``READING_MAX_WAIT`` (then the previous reading stays)."""
        if waited <= READING_MAX_WAIT:
            self._now, self._at = now.astimezone(UTC), time.monotonic()

    def forget(self) -> None:
        """Drop the reading."""
        self._now = None

    def estimate(self) -> datetime | None:
        """The reading plus the time elapsed since (aware UTC); None without a reading no
        older than ``ANCHOR_MAX_AGE`` seconds, or while estimates are off."""
        if self._now is None:
            return None
        now = time.monotonic()
        age = now - self._at
        if age > ANCHOR_MAX_AGE or now < ClockAnchor.off_until:
            return None
        return self._now + timedelta(seconds=age)

    @staticmethod
    def accepted() -> None:
        """An estimate passed its check: the refusals in a row start again from zero."""
        ClockAnchor.refusals = 0

    def refused(self) -> None:
        """Forget the reading and count a refusal (see the class attributes)."""
        self.forget()
        ClockAnchor.refusals += 1
        if ClockAnchor.refusals >= MAX_REFUSALS:
            ClockAnchor.refusals = 0
            ClockAnchor.off_until = time.monotonic() + ESTIMATES_OFF_FOR


def guarded(update: str) -> str:
    """An ``UPDATE`` of one row (matched on its primary key) wrapped to fail its transaction
    with SQLSTATE 22012 (division by zero, in both dialects) when it writes none."""
    return "".join((sql.GUARD_OPEN, update, sql.GUARD_CLOSE))


class TryConnection:
    """One try's connection: its BEGIN and its deferred writes ride with the next request.

    After :meth:`open_lazily`, the first request opens the transaction and hands the
    transaction timestamp to ``on_now``. :meth:`send_later` queues a write whose answer nobody
    reads (a plain single-row ``INSERT``: it either writes its row or fails with an error),
    bound on the client; the queue goes ahead of the next statement in the same request, or
    ahead of the outbox insert and ``COMMIT`` (:meth:`finish`). A queued write that fails
    stops its request there (both dialects), so the error surfaces before anything after it
    ran, the ``COMMIT`` included.

    Args:
        conn: the pool connection (autocommit; no transaction open).
        on_now: called with the transaction timestamp once the BEGIN has answered.

    Attributes:
        raw: the pool connection.
        by_name: whether some request of this try executed a statement prepared by name.
    """

    def __init__(self, conn: AsyncConnection[TupleRow], on_now: Callable[[datetime], None]) -> None:
        self.raw = conn
        self._on_now = on_now
        self._opening = False
        self._deferred: list[str] = []
        self._guards: list[str] = []  # what the queued compare-and-sets write, for errors
        self._answers: list[Callable[[TupleRow], None]] = []  # for the queued checks' rows
        self._estimated = False  # the check of an estimated now() waits in the queue
        self.by_name = False  # some request of this try executed a statement prepared by name

    def open_lazily(self) -> None:
        """Send the BEGIN with the next request; no I/O now."""
        self._opening = True

    @property
    def _anchor(self) -> ClockAnchor | None:
        """The pool connection's reading of the clock (None off the store's pool)."""
        anchor: ClockAnchor | None = getattr(self.raw, "clock", None)
        return anchor

    def estimate_now(self, not_before: datetime | None = None) -> datetime | None:
        """This try's timestamp estimated from the connection's last reading of the database
        clock (:class:`ClockAnchor`), without a round trip, raised to ``not_before`` if that
        is later (a time the caller knows to precede the try); None when it cannot be (the
        BEGIN went already, no recent reading, estimates off), and the caller reads the clock.

        The check of the estimate (``sql.CHECK_ESTIMATED_NOW``) is queued right after the
        BEGIN, so it runs before any statement of the try; if the database refuses it, the
        request that carries it raises :class:`EstimateRefused` and nothing after it ran.
        """
        anchor = self._anchor
        if not self._opening or anchor is None or (estimate := anchor.estimate()) is None:
            return None
        if not_before is not None and not_before > estimate:
            estimate = not_before
        check = bind_on_client(
            self.raw, sql.CHECK_ESTIMATED_NOW, (estimate, estimate + ESTIMATE_TOLERANCE)
        )
        if check is None:  # pragma: no cover - a datetime always binds
            return None
        self._deferred.insert(0, check)
        self._estimated = True
        return estimate

    async def send_later(self, query: str, params: Any) -> None:
        """Queue a write for the next request; one that cannot be bound on the client is sent
        now instead (with whatever is owed before it)."""
        bound = bind_on_client(self.raw, query, params)
        if bound is None:
            await self.execute(query, params)
        else:
            self._deferred.append(bound)

    def send_guarded(self, query: str, params: Any, what: str) -> bool:
        """Queue a single-row compare-and-set (``UPDATE ... WHERE id = %s AND version = %s``)
        for the next request, wrapped by :func:`guarded`; its failure to write the row raises
        ``ConcurrentUpdate`` naming ``what`` from the request that carries it.

        Only for a row this try has read (or written) at the version the statement compares:
        then no other transaction can change it unseen before this one commits, so the write's
        row count need not be waited for.

        Returns:
            False, with nothing queued, when the statement cannot be bound on the client (the
            caller sends it and checks its row count itself).
        """
        return self.send_check(guarded(query), params, what)

    def send_check(
        self,
        query: str,
        params: Any,
        what: str,
        on_row: Callable[[TupleRow], None] | None = None,
    ) -> bool:
        """Queue a statement in the guard's form (22012 unless it matched its row: a wrapped
        compare-and-set, :meth:`send_guarded`, or a check of a row this try has not read,
        ``sql.CONFIRM_TASK``) for the next request; its failure raises ``ConcurrentUpdate``
        naming ``what`` from the request that carries it, and nothing after it runs.
        ``on_row`` gets the statement's answer row (a result whose first column is
        ``sql.CONFIRMED_COLUMN``) when that request returns.

        Returns:
            False, with nothing queued, when the statement cannot be bound on the client.
        """
        bound = bind_on_client(self.raw, query, params)
        if bound is None:
            return False
        self._deferred.append(bound)
        self._guards.append(what)
        if on_row is not None:
            self._answers.append(on_row)
        return True

    async def execute(
        self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: bool = False
    ) -> AsyncCursor[TupleRow]:
        """psycopg's ``execute``, after what is owed: the BEGIN and the queued writes, in the
        same request when ``query`` can be bound on the client.

        The returned cursor is positioned on ``query``'s own result, as psycopg's would be.
        """
        if not self._opening and not self._deferred:
            return await self.raw.execute(query, params, prepare=prepare, binary=binary)
        bound = None if binary else bind_on_client(self.raw, query, params)
        if bound is None:
            await self._request([])
            return await self.raw.execute(query, params, prepare=prepare, binary=binary)
        return await self._request([bound])

    async def flush(self) -> None:
        """Send what is owed (the BEGIN, whose ``now()`` goes to ``on_now``, and the queued
        writes) as one request; nothing when nothing is owed."""
        if self._opening or self._deferred:
            await self._request([])

    async def finish(self, tail: list[str]) -> AsyncCursor[TupleRow] | None:
        """Send what is owed, then ``tail`` (the outbox insert and ``COMMIT``), as one request;
        None, with nothing sent, when the try sent no statement and owes no write.
        """
        if self._opening and not self._deferred and len(tail) == 1:
            self._opening = False
            return None  # only the COMMIT: no transaction was opened
        return await self._request(tail)

    async def _request(self, texts: list[str]) -> AsyncCursor[TupleRow]:
        """One simple query: the BEGIN if owed, the queued writes, then ``texts``. The cursor
        is left on the last result; the queued checks' answer rows go to their ``on_row``.

        Raises:
            ConcurrentUpdate: a queued compare-and-set wrote no row (nothing after it ran).
            psycopg.Error: any other failure of the request.
        """
        opening, deferred, guards = self._opening, self._deferred, self._guards
        estimated, answers = self._estimated, self._answers
        self._opening, self._deferred, self._guards, self._answers = False, [], [], []
        self._estimated = False
        parts = ([sql.BEGIN_WITH_NOW] if opening else []) + deferred + texts
        if not self.by_name:
            self.by_name = any(part.startswith("EXECUTE dtq_") for part in parts)
        sent_at = time.monotonic() if opening else 0.0  # only a BEGIN's reading is timed
        try:
            cur = await self.raw.execute("; ".join(parts), prepare=False)
        except psycopg.errors.DivisionByZero as exc:
            refusal = self._refusal(estimated, guards)
            if refusal is None:
                raise
            raise refusal from exc
        if estimated:
            ClockAnchor.accepted()
        if opening:
            cur.nextset()  # the BEGIN's now()
            await self._take_now(cur, time.monotonic() - sent_at)
        while True:  # to the last result; the checks' answers on the way
            if (
                answers
                and (described := cur.description)
                and (described[0].name == sql.CONFIRMED_COLUMN)
            ):
                row = await cur.fetchone()
                if row is not None:
                    answers.pop(0)(row)
            if not cur.nextset():
                return cur

    def _refusal(self, estimated: bool, guards: list[str]) -> Exception | None:
        """What a request that failed with 22012 raises: the check of an estimated now()
        (sent right after the BEGIN), or a queued compare-and-set or check that found no row;
        with both in the request, either (a re-run reads the clock). None: neither was queued,
        the error is the request's own."""
        anchor = self._anchor
        if estimated and guards:
            if anchor is not None:
                anchor.forget()
            return ConcurrentUpdate(
                f"{' or '.join(guards)} changed since this transaction read it, or the"
                " estimated transaction timestamp was refused"
            )
        if estimated:
            if anchor is not None:
                anchor.refused()
            return EstimateRefused(
                "the estimated transaction timestamp was not within the tolerance"
            )
        if not guards:
            return None
        return ConcurrentUpdate(f"{' or '.join(guards)} changed since this transaction read it")

    async def _take_now(self, cur: AsyncCursor[TupleRow], waited: float) -> None:
        row = await cur.fetchone()
        if row is None:  # pragma: no cover - SELECT now() always answers a row
            raise RuntimeError("BEGIN did not return the transaction timestamp")
        if (anchor := self._anchor) is not None:
            anchor.know(row[0], waited)
        self._on_now(row[0])
