"""What the database can store: refuse it at submit, identically on PostgreSQL and CockroachDB.

PostgreSQL refuses ``\\u0000`` inside JSONB strings while CockroachDB accepts it (CRDB.md), JSON
has no representation for NaN or infinities, and a lone UTF-16 surrogate has no UTF-8 encoding;
we refuse all of these ourselves so both databases behave the same and a bad payload is a 400,
never a 500 or a task stuck mid-transaction. Free text that must be kept whatever it holds (a
handler's error) is escaped instead: :func:`storable_text`.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from dtq.domain.errors import InvalidMetadata, InvalidPayload

#: Largest and smallest integers accepted in a payload (signed 64-bit).
#: Longest error text stored for a run (a handler's failure, a hand-back's reason), escapes
#: counted: what both runtimes record, and the most the HTTP worker protocol accepts.
MAX_ERROR_CHARS = 10_000

INT_MAX = 2**63 - 1
INT_MIN = -(2**63)

#: A lone UTF-16 surrogate: only a string decoded with ``surrogateescape`` or
#: ``surrogatepass`` (``os.fsdecode`` of a non-UTF-8 file name) holds one.
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What :func:`storable_text` escapes: NUL and lone surrogates.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_storable(value: Any, *, field: str, max_depth: int = 64) -> None:
    """Raise ``InvalidPayload`` unless ``value`` is JSON the database can store.

    Accepted: None, bool, int within signed 64 bits, finite float, str without NUL or a lone
    surrogate, list, and dict with such str keys, nested at most ``max_depth`` levels.

    Args:
        value: decoded JSON value (payload or metadata).
        field: the request field it came from, e.g. ``tasks[3].payload``; errors name a path
            below it (``tasks[3].payload.user.name``).
        max_depth: maximum nesting of lists/objects.

    Raises:
        InvalidPayload: with ``field`` set to the path of the offending value; a key holding
            NUL or a lone surrogate is named by its own path, either written as its escape
            (``tasks[3].payload.k\\u0000``, ``tasks[3].payload.k\\udcff``).
    """
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, list | dict) and depth >= max_depth:
            # ``depth`` containers enclose this one: it would be nesting level max_depth + 1
            raise InvalidPayload(f"nested deeper than {max_depth} levels", field=path)
        if isinstance(item, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(item))
        elif isinstance(item, dict):
            for key, v in item.items():
                _check_key(key, path)
                stack.append((v, f"{path}.{key}", depth + 1))
        else:
            _check_scalar(item, path)


def _check_key(key: object, path: str) -> None:
    if not isinstance(key, str):
        raise InvalidPayload("object keys must be strings", field=path)
    if "\x00" in key:
        raise InvalidPayload(
            "object key contains a NUL character (\\u0000)", field=f"{path}.{storable_text(key)}"
        )
    if not key.isascii() and (found := _SURROGATE.search(key)):
        raise InvalidPayload(
            f"object key contains a lone UTF-16 surrogate ({_escape(found)})",
            field=f"{path}.{storable_text(key)}",
        )


def _check_scalar(item: object, path: str) -> None:
    if item is None or isinstance(item, bool):
        return
    if isinstance(item, int):
        if not INT_MIN <= item <= INT_MAX:
            raise InvalidPayload("integer out of the signed 64-bit range", field=path)
    elif isinstance(item, float):
        if not math.isfinite(item):
            raise InvalidPayload("number is not finite", field=path)
    elif isinstance(item, str):
        if "\x00" in item:
            raise InvalidPayload("string contains a NUL character (\\u0000)", field=path)
        if not item.isascii() and (found := _SURROGATE.search(item)):
            raise InvalidPayload(
                f"string contains a lone UTF-16 surrogate ({_escape(found)})", field=path
            )
    else:
        raise InvalidPayload(f"not a JSON value: {type(item).__name__}", field=path)


def check_metadata(value: Any) -> None:
    """Raise ``InvalidMetadata`` unless ``value`` can be stored as a job's or worker's metadata:
    the rules of :func:`check_storable`, below ``metadata``.

    Raises:
        InvalidMetadata: ``field`` is the path below ``metadata`` of the offending value.
    """
    try:
        check_storable(value, field="metadata")
    except InvalidPayload as exc:
        raise InvalidMetadata(exc.detail, field=exc.field) from None


#: Where a result too large for the task row should go instead (issue 13 item 4).
ARTIFACTS_HINT = "store large outputs as an artifact and return its reference"


def check_result(value: Any, *, max_bytes: int) -> int:
    """Raise ``InvalidPayload`` unless a handler's return value can be stored as its result.

    The value must pass :func:`check_storable` (JSON types only, no NUL, finite numbers,
    signed 64-bit integers, nesting ≤ 64) and encode to at most ``max_bytes`` bytes of UTF-8
    JSON (``API_MAX_RESULT_BYTES``). None is a valid result (stored as null).

    Returns:
        The size of the encoded JSON in bytes.

    Raises:
        InvalidPayload: ``field`` is the path below ``result`` of the offending value, or
            ``result`` when it is too large; the message says why and points to artifacts.
    """
    return _check_stored(value, "result", "return", max_bytes, " (API_MAX_RESULT_BYTES)")


#: Largest progress value, in bytes of UTF-8 JSON (``task.progress``, issue 13 item 5): it is
#: written on lease renewals, so it stays small; large state belongs in an artifact.
MAX_PROGRESS_BYTES = 64 * 1024


def check_progress(value: Any, *, max_bytes: int = MAX_PROGRESS_BYTES) -> int:
    """Raise ``InvalidPayload`` unless ``value`` can be stored as a task's progress.

    The rules of :func:`check_storable` (JSON types only, no NUL, finite numbers, signed 64-bit
    integers, nesting ≤ 64) and at most ``max_bytes`` bytes of UTF-8 JSON (64 KiB by default).

    Returns:
        The size of the encoded JSON in bytes.

    Raises:
        InvalidPayload: ``field`` is the path below ``progress`` of the offending value, or
            ``progress`` when it is too large; the message says why.
    """
    return _check_stored(value, "progress", "report", max_bytes, "")


#: Compact UTF-8 JSON, the size a stored value is measured in (built once).
_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _check_stored(value: Any, what: str, verb: str, max_bytes: int, setting: str) -> int:
    """The rules of :func:`check_storable` below ``what``, then at most ``max_bytes`` of compact
    UTF-8 JSON; returns the size. ``verb`` and ``setting`` only shape the messages."""
    try:
        check_storable(value, field=what)
    except InvalidPayload as exc:
        raise InvalidPayload(
            f"{what} cannot be stored: {exc.detail} at {exc.field}"
            f" ({verb} JSON: dict, list, str, finite number, bool or None)",
            field=exc.field,
        ) from None
    size = len(_COMPACT_JSON.encode(value).encode())
    if size > max_bytes:
        raise InvalidPayload(
            f"{what} is {size} bytes as JSON, over the limit of {max_bytes}{setting}:"
            f" {ARTIFACTS_HINT}",
            field=what,
        )
    return size


def storable_text(text: str, *, max_chars: int | None = None) -> str:
    """``text`` as free text every store and JSON body can carry (a handler's error, a reason).

    NUL and each lone UTF-16 surrogate are written as their six-character escapes (``\\u0000``,
    ``\\udcff``, as Python's ``backslashreplace`` writes a surrogate); everything else is kept.

    Args:
        text: any text.
        max_chars: the most characters returned, escapes counted; an escape that would not fit
            is left out whole (never cut). None: no limit.

    Returns:
        ``text`` itself when it holds nothing to escape and fits.
    """
    if max_chars is not None:
        text = text[:max_chars]  # escaping only lengthens it
    if "\x00" not in text and (text.isascii() or _SURROGATE.search(text) is None):
        return text
    room = 6 * len(text) if max_chars is None else max_chars
    parts: list[str] = []
    start = 0
    for found in _UNSTORABLE.finditer(text):
        plain = text[start : found.start()]
        if len(plain) + 6 > room:
            parts.append(plain[:room])
            return "".join(parts)
        parts += (plain, _escape(found))
        room -= len(plain) + 6
        start = found.end()
    parts.append(text[start:][:room])
    return "".join(parts)


def _escape(found: re.Match[str]) -> str:
    """The ``\\uXXXX`` escape of the one character ``found`` matched."""
    return f"\\u{ord(found[0]):04x}"
