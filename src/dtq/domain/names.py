"""The names a task's ``kind`` and ``priority`` may have: one rule for the API, which refuses
any other in a request (``entrypoints/api/schemas.py``), and for the worker runtime, which
refuses to register or poll one (a handler or a tier no submit could ever reach).

* ``kind`` (and a task's ``name``): 1..200 characters of ``A-Z a-z 0-9 . _ : -``, so it is safe
  in logs, metric labels, URLs and Redis keys.
* ``priority``: 1..32 characters of ``a-z 0-9 _ -`` (it names a Redis list, spec §5).

Each pattern ends in ``(?!\\n)$`` because Python's ``$`` also matches before a trailing newline;
the lookahead makes ``"echo\\n"`` fail in Python exactly as it does in ECMA regex (the OpenAPI
document shows these patterns).
"""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9._:-]+(?!\n)$"
#: Longest kind (and task name), in characters.
NAME_MAX = 200
PRIORITY_PATTERN = r"^[a-z0-9_-]{1,32}(?!\n)$"
#: What each pattern means, in the words an error uses instead of the regex.
NAME_HINT = "letters, digits, '.', '_', ':' or '-' only"
PRIORITY_HINT = "1 to 32 characters of a-z, 0-9, '_' or '-'"

_NAME = re.compile(NAME_PATTERN)
_PRIORITY = re.compile(PRIORITY_PATTERN)
#: Characters of a refused value shown in an error before it is cut.
_SHOWN = 20


def kind_problem(kind: object) -> str | None:
    """Why the API would refuse ``kind`` (``"kind 'a b' is refused by the API: ..."``, one line
    naming it, a long one cut), or None when it is a kind the API accepts."""
    if isinstance(kind, str) and len(kind) <= NAME_MAX and _NAME.fullmatch(kind):
        return None
    rule = f"1 to {NAME_MAX} characters of {NAME_HINT}"
    return f"kind {_shown(kind)} is refused by the API: {rule}"


def priority_problem(priority: object) -> str | None:
    """Why the API would refuse ``priority`` (``"'a b' is not a priority: ..."``), or None when
    it is a priority the API accepts."""
    if isinstance(priority, str) and _PRIORITY.fullmatch(priority):
        return None
    return f"{_shown(priority)} is not a priority: {PRIORITY_HINT}"


def _shown(value: object) -> str:
    """``repr(value)``, cut after :data:`_SHOWN` characters of a long string (its length said)."""
    if isinstance(value, str) and len(value) > _SHOWN:
        cut = repr(value[:_SHOWN])
        return f"{cut[:-1]}...{cut[-1]} ({len(value)} characters)"
    return repr(value)
