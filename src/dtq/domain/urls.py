"""The checks every ``http(s)://`` address dtq is given shares: a webhook's url, an OTLP
endpoint, an S3 endpoint, the orchestrator a worker calls over HTTP.

``CONTROL_CHARACTERS`` is the character class of the control characters (C0, DEL, C1) that no
one-line text dtq stores or prints may hold; the API's patterns are built from it too.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

#: C0, DEL and C1 controls, as the inside of a regex character class.
CONTROL_CHARACTERS = r"\x00-\x1f\x7f-\x9f"

_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def has_control(text: str) -> bool:
    """Whether ``text`` holds a control character (C0, DEL or C1)."""
    return _CONTROL.search(text) is not None


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an absolute ``http://`` or ``https://`` URL with a host and a valid
    port, without whitespace or control characters (a phrase such as ``"names no host"``), or
    None when it is one."""
    if has_control(url):
        return "holds a control character; percent-encode it"
    if any(c.isspace() for c in url):
        return "holds whitespace"
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        return f"is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "names no host"
    return None
