"""msgspec's validation errors in the API's words: the ``message`` and ``field`` of a 400
``validation_error`` for a body that its Struct refused, or a parameter Litestar refused.

msgspec reports ``"<reason> - at `$.tasks[0].kind`"``. :func:`describe` takes the field's path
from there, in the domain's notation (``tasks[0].kind``; ``$.data`` is Litestar's name for a
body), and says the reason as the rest of the API does, by what the value must be:

=========================================  ======================================================
msgspec                                    the API
=========================================  ======================================================
Expected `str` of length >= 1              must be a non-empty string
Expected `str` of length <= 200            must be at most 200 characters long
Expected `array` of length >= 1            must be a non-empty array
Expected `int` >= 1                        must be at least 1
Expected `int`, got `str`                  must be an integer, got a string
Expected `str` matching regex '<pattern>'  must be a string with <its PATTERN_HINTS entry>
Invalid enum value 'linear'                must be 'exponential' or 'fixed', got 'linear'
Object missing required field `kind`       required field 'kind' is missing
Object contains unknown field `jiter`      unknown field 'jiter'; accepted: backoff, delay, ...
Invalid UUID                               must be a UUID
Input data was truncated                   it ends before the JSON value is complete
Invalid UTF-8 encoded string               a string holds bytes that are not UTF-8 (JSON text
                                           must be UTF-8)
=========================================  ======================================================

An error about the body itself (no field) starts with "the request body"; one about its JSON
(the last two rows) follows "request body is not valid JSON:". A reason not in this table is
passed on as msgspec wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

from dtq.entrypoints.api.schemas import PATTERN_HINTS

__all__ = ["describe", "reason"]

_AT_PATH = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_BODY_ROOT = re.compile(r"^\.data(?=$|[.\[])")
_NAMED_FIELD = re.compile(r"^Object (?:missing required|contains unknown) field `(?P<name>[^`]+)`")
_SEGMENT = re.compile(r"\.?(?P<name>[^.\[]+)|\[(?P<index>[0-9]+)\]")

#: msgspec's type names (``Expected `int`, got `str```) in words.
_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
    "bytes": "a base64 string",
    "uuid": "a UUID",
    "datetime": "an RFC 3339 time",
}
#: How many of a length-limited thing there are, per msgspec type.
_UNITS = {"str": "characters long", "bytes": "bytes long", "array": "items", "object": "members"}
_BOUNDS = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}
#: The end of every pattern of the schemas: ``$`` alone would also match before a final newline.
_NEWLINE_GUARD = "(?!\\n)"
#: The longest part of the refused value a message quotes.
_SHOWN = 64
#: :data:`PATTERN_HINTS` by each pattern as msgspec quotes it (its ``repr`` between the quotes).
_HINTS_BY_QUOTED = {repr(pattern)[1:-1]: hint for pattern, hint in PATTERN_HINTS.items()}


def describe(
    error: msgspec.ValidationError, model: type[Any] | None = None
) -> tuple[str, str | None]:
    """The message and field of a 400 for ``error``.

    Args:
        error: what msgspec raised.
        model: the Struct the body was decoded into, when known; an unknown field or enum value
            is then answered with the accepted ones.

    Returns:
        ``(message, field)``; field is None for the body itself. A missing body (Litestar's
        ``data`` absent) is "a JSON request body is required".
    """
    parts = _AT_PATH.match(str(error))
    assert parts is not None  # the pattern matches any text
    text, path = parts["message"], _BODY_ROOT.sub("", parts["path"] or "").lstrip(".")
    field = path
    if named := _NAMED_FIELD.match(text):
        field = f"{path}.{named['name']}" if path else named["name"]
    if field == "data":
        return "a JSON request body is required", None
    message = reason(text, _type_at(model, path) if model is not None else None)
    if not field:
        return f"the request body {message}", None
    return message, field


def reason(text: str, found: mi.Type | None = None) -> str:
    """msgspec's reason (no ``- at`` path) in the API's words; as given when not one of its own.

    Args:
        text: e.g. ``Expected `int` >= 1``.
        found: the type of the value the reason is about (the object's, for an unknown field),
            to list the accepted fields or values.
    """
    for pattern, say in _REASONS:
        if matched := pattern.fullmatch(text):
            return say(matched, found)
    return text


def _words(types: str) -> str:
    names = [_TYPE_WORDS.get(name, name) for name in types.split(" | ")]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _type(matched: re.Match[str], _: mi.Type | None) -> str:
    return f"must be {_words(matched['want'])}, got {_words(matched['got'])}"


def _length(matched: re.Match[str], _: mi.Type | None) -> str:
    kind, bound, n = matched["type"], matched["op"], int(matched["n"])
    if bound == ">=" and n == 1:
        return f"must be a non-empty {_TYPE_WORDS[kind].split()[-1]}"
    unit = _UNITS[kind]
    if kind in ("str", "bytes"):
        return f"must be {_BOUNDS[bound]} {n} {unit}"
    return f"must have {_BOUNDS[bound]} {n} {unit}"


def _bound(matched: re.Match[str], _: mi.Type | None) -> str:
    return f"must be {_BOUNDS[matched['op']]} {matched['n']}"


def _multiple(matched: re.Match[str], _: mi.Type | None) -> str:
    return f"must be a multiple of {matched['n']}"


def _pattern(matched: re.Match[str], _: mi.Type | None) -> str:
    r"""msgspec quotes the pattern as Python's ``repr`` does (backslashes doubled, a character
    that is not printable as its escape); an unknown one is shown without the ``(?!\n)`` guard
    every pattern ends with."""
    hint = _HINTS_BY_QUOTED.get(matched["pattern"])
    if hint is None:
        pattern = matched["pattern"].replace("\\\\", "\\")
        return "must match " + pattern.replace(_NEWLINE_GUARD, "")
    return f"must be a string with {hint}"


def _choice(matched: re.Match[str], found: mi.Type | None) -> str:
    got = matched["value"][:_SHOWN]
    values: tuple[Any, ...] = ()
    if isinstance(found, mi.LiteralType):
        values = found.values
    elif isinstance(found, mi.EnumType):
        values = tuple(member.value for member in found.cls)
    if not values:
        return f"{got} is not one of the accepted values"
    shown = [repr(v) for v in values]
    listed = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
    return f"must be {listed}, got {got}"


def _missing(matched: re.Match[str], _: mi.Type | None) -> str:
    return f"required field {matched['name']!r} is missing"


def _unknown(matched: re.Match[str], found: mi.Type | None) -> str:
    message = f"unknown field {matched['name'][:_SHOWN]!r}"
    if isinstance(found, mi.StructType):
        message += "; accepted: " + ", ".join(f.encode_name for f in found.fields)
    return message


_REASONS: list[tuple[re.Pattern[str], Callable[[re.Match[str], mi.Type | None], str]]] = [
    (re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>[^`]+)`"), _type),
    (
        re.compile(
            r"Expected `(?P<type>str|bytes|array|object)` of length (?P<op>>=|<=) (?P<n>\d+)"
        ),
        _length,
    ),
    (re.compile(r"Expected `(?:int|float)` (?P<op>>=|<=|>|<) (?P<n>\S+)"), _bound),
    (re.compile(r"Expected `int` that's a multiple of (?P<n>\d+)"), _multiple),
    (re.compile(r"Expected `str` matching regex '(?P<pattern>.*)'", re.DOTALL), _pattern),
    (re.compile(r"Invalid (?:enum )?value (?P<value>.+)", re.DOTALL), _choice),
    (re.compile(r"Object missing required field `(?P<name>[^`]+)`"), _missing),
    (re.compile(r"Invalid UUID"), lambda _, __: "must be a UUID"),
    (re.compile(r"Invalid RFC3339 encoded datetime"), lambda _, __: "must be an RFC 3339 time"),
    (re.compile(r"Object contains unknown field `(?P<name>[^`]+)`", re.DOTALL), _unknown),
    (
        re.compile(r"Input data was truncated"),
        lambda _, __: "it ends before the JSON value is complete",
    ),
    (
        re.compile(r"Invalid UTF-8 encoded string"),
        lambda _, __: "a string holds bytes that are not UTF-8 (JSON text must be UTF-8)",
    ),
]


def _type_at(model: type[Any], path: str) -> mi.Type | None:
    """The type ``path`` (``tasks[0].retry``) leads to in ``model``, or None when it leaves the
    declared types (a payload's inside)."""
    node: mi.Type | None = _bare(mi.type_info(model))
    for step in _SEGMENT.finditer(path):
        name, index = step["name"], step["index"]
        if name is not None and isinstance(node, mi.StructType):
            field = next((f for f in node.fields if f.encode_name == name), None)
            node = None if field is None else _bare(field.type)
        elif index is not None and isinstance(node, mi.ListType):
            node = _bare(node.item_type)
        else:
            return None
    return node


def _bare(node: mi.Type) -> mi.Type | None:
    """``node`` without its ``Meta`` annotation; of a union, the member that is an object,
    an array or a set of values (``RetryRequest | UnsetType`` -> the Struct)."""
    if isinstance(node, mi.Metadata):
        node = node.type
    if not isinstance(node, mi.UnionType):
        return node
    wanted = (mi.StructType, mi.ListType, mi.LiteralType, mi.EnumType)
    members = [t for t in node.types if isinstance(t, wanted)]
    return members[0] if len(members) == 1 else None
