"""Parsing and checking single configuration values: Go durations, listen and Redis addresses.

Every error is a :class:`ConfigError` naming the variable, one line, so the CLI can print it and
exit 2. :mod:`dtq.entrypoints.config` re-exports all of this.
"""

from __future__ import annotations

import re
from fractions import Fraction
from urllib.parse import urlsplit

import durationpy

# Go's time.ParseDuration grammar: an optional sign, then one or more decimal numbers each with
# a unit; or the bare "0". durationpy alone is more lenient (it takes "1d" and "1h-5m"). Digits
# are ASCII only ([0-9], not \d): Go and the docs mean 0-9, while \d and int() also take
# fullwidth or Arabic-Indic digits.
_GO_DURATION = re.compile(
    r"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+|[-+]?0"
)
#: One number-and-unit term of a Go duration, and each unit's length in seconds.
_TERM = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<unit>ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),
    "μs": Fraction(1, 10**6),
    "ms": Fraction(1, 10**3),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
#: A decimal integer as dtq accepts one: optional sign, ASCII digits (no "_", no Unicode digits).
_ASCII_INTEGER = re.compile(r"[-+]?[0-9]+")
_MAX_PORT = 65535
_REDIS_SCHEMES = ("redis", "rediss", "unix")
_REDIS_CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_CLUSTER_FORM = "redis+cluster://host:port[,host:port...]"
_REDIS_DB_PATH = re.compile(r"(/[0-9]*)?")
_UNEXPECTED_KEYWORD = re.compile(r"unexpected keyword argument '([^']+)'")
# options the Redis adapter sets itself, which a URL's would override (redis-py: the URL wins)
_FIXED_OPTIONS = frozenset({"decode_responses", "encoding", "encoding_errors"})


class ConfigError(Exception):
    """A configuration variable is missing or has a value dtq cannot use.

    Args:
        variable: the environment variable's name, e.g. ``LEASE_DURATION``.
        message: one line saying what is wrong and what is expected.
    """

    def __init__(self, variable: str, message: str) -> None:
        self.variable = variable
        self.message = message
        super().__init__(f"{variable}: {message}")


def ascii_int(text: str) -> int:
    """Parse a decimal integer of ASCII digits with an optional sign; the one integer parser of
    configuration values (``int()`` alone also takes ``"1_000"`` and non-ASCII digits such as
    fullwidth or Arabic-Indic ones).

    Raises:
        ValueError: anything else.
    """
    if not _ASCII_INTEGER.fullmatch(text):
        raise ValueError(f"not an ASCII decimal integer: {text!r}")
    return int(text)


def exact_duration(value: str, *, variable: str) -> Fraction:
    """The exact length in seconds of a Go duration (``1h0.5us``), for comparing it with a bound:
    :func:`parse_duration` gives a float through a ``timedelta``, whose microseconds drop a
    smaller excess (``8784h1ns`` would equal ``8784h``).

    Raises:
        ConfigError: the text is not a Go duration.
    """
    text = value.strip()
    if not _GO_DURATION.fullmatch(text):
        raise ConfigError(variable, f"not a duration: {value!r} (use e.g. 500ms, 30s, 2m, 1h30m)")
    total = sum(
        (Fraction(t["number"]) * _UNIT_SECONDS[t["unit"]] for t in _TERM.finditer(text)),
        Fraction(0),
    )
    return -total if text.startswith("-") else total


def listen_address(value: str, *, variable: str = "ORCHESTRATOR_LISTEN") -> tuple[str, int]:
    """Split a Go-style listen address into host and port.

    ``:8080`` binds every IPv4 interface (``0.0.0.0``); ``[::1]:8080`` is an IPv6 host.

    Args:
        value: ``[host]:port``; port 0 asks the OS for a free port.
        variable: the variable named in errors.

    Returns:
        ``(host, port)``.

    Raises:
        ConfigError: the value has no port, or the port is not an integer in 0..65535.
    """
    host, sep, port_text = value.strip().rpartition(":")
    if not sep:
        raise ConfigError(variable, f"expected [host]:port, got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = ascii_int(port_text)
    except ValueError:
        raise ConfigError(variable, f"port must be an integer, got {value!r}") from None
    if not 0 <= port <= _MAX_PORT:
        raise ConfigError(variable, f"port must be in 0..65535, got {port}")
    return (host or "0.0.0.0", port)


def redis_address(value: str, *, variable: str = "REDIS_ADDR") -> str:
    """Check a Redis address: ``host:port`` (spec §8), a redis, rediss or unix URL, or a Redis
    Cluster seed list ``redis+cluster://[user:password@]host:port[,host:port...]``
    (``rediss+cluster://`` for TLS; issue 17 item 6).

    Args:
        value: the address; IPv6 hosts in brackets (``[::1]:6379``).
        variable: the variable named in errors.

    Returns:
        ``value`` unchanged.

    Raises:
        ConfigError: spaces, no host, no port (``host:port`` form and every cluster seed), a port
            outside 1..65535, a URL scheme other than the five above, several hosts without
            the cluster scheme, a path or query on a cluster seed list, a malformed URL
            (e.g. an unclosed ``[``), a URL path that is not a database number, a query
            option redis-py's connections do not take or whose value they refuse, or one the
            Redis adapter sets itself (``decode_responses``, ``encoding``, ``encoding_errors``).
    """
    if any(ch.isspace() for ch in value):
        raise ConfigError(variable, f"must not contain spaces, got {value!r}")
    try:
        return _redis_address(value, variable=variable)
    except ValueError as exc:  # urlsplit's own refusals, e.g. "Invalid IPv6 URL"
        raise ConfigError(variable, f"{str(exc).rstrip('.')}, got {value!r}") from None


def _redis_address(value: str, *, variable: str) -> str:
    scheme, sep, rest = value.partition("://")
    if sep and scheme.lower() in _REDIS_CLUSTER_SCHEMES:
        _cluster_seeds(value, rest, variable=variable)
        return value
    if sep and scheme.lower() not in _REDIS_SCHEMES:
        allowed = "|".join(f"{s}://" for s in (*_REDIS_SCHEMES, *_REDIS_CLUSTER_SCHEMES))
        raise ConfigError(variable, f"URL scheme must be {allowed}, got {value!r}")
    if not sep and "," in value:
        raise ConfigError(
            variable, f"several hosts are a Redis Cluster seed list: {_CLUSTER_FORM}, got {value!r}"
        )
    if sep:
        _redis_url_options(value, variable=variable)
    if sep and scheme.lower() == "unix":
        return value
    parts = urlsplit(value if sep else f"redis://{value}")
    expected = "expected host:port (e.g. 127.0.0.1:6379) or a redis:// URL"
    if not sep and (parts.path or parts.query or parts.fragment):
        raise ConfigError(variable, f"{expected}, got {value!r}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port in (-1, 0):
        raise ConfigError(variable, f"port must be an integer in 1..65535, got {value!r}")
    if not parts.hostname or (port is None and not sep):
        raise ConfigError(variable, f"{expected}, got {value!r}")
    return value


def _redis_url_options(value: str, *, variable: str) -> None:
    """Check a redis, rediss or unix URL as redis-py reads it: a database ``/<n>`` (n >= 0,
    or ``?db=n`` on a unix socket), and only query options its connections take, with values
    they accept (``socket_timeout=abc`` and ``foo=bar`` fail here, not at the first command)."""
    from redis.asyncio import ConnectionPool  # only for a URL: the CLI starts faster without

    path = urlsplit(value).path
    if value.partition("://")[0].lower() != "unix" and not _REDIS_DB_PATH.fullmatch(path):
        raise ConfigError(
            variable, f"the URL's path is a database number (/0, /1, ...), got {value!r}"
        )
    try:
        pool = ConnectionPool.from_url(value)
        pool.make_connection()  # type: ignore[no-untyped-call]  # the object only: no I/O
    except TypeError as exc:
        unknown = _UNEXPECTED_KEYWORD.search(str(exc))
        name = unknown.group(1) if unknown else str(exc)
        raise ConfigError(variable, f"unknown URL option {name!r}, got {value!r}") from None
    except ValueError as exc:
        raise ConfigError(variable, f"{str(exc).rstrip('.')}, got {value!r}") from None
    fixed = sorted(_FIXED_OPTIONS.intersection(pool.connection_kwargs))
    if fixed:
        raise ConfigError(variable, f"dtq sets the URL option {fixed[0]!r} itself, got {value!r}")
    db = pool.connection_kwargs.get("db", 0)
    if not isinstance(db, int) or db < 0:
        raise ConfigError(variable, f"the database number must be 0 or more, got {value!r}")


def _cluster_seeds(value: str, rest: str, *, variable: str) -> None:
    """Check the ``[user:password@]host:port[,host:port...]`` part of a cluster seed list."""
    hosts = rest.rpartition("@")[2]
    if not hosts:
        raise ConfigError(variable, f"no seed node: expected {_CLUSTER_FORM}, got {value!r}")
    for seed in hosts.split(","):
        parts = urlsplit(f"redis://{seed}")
        if parts.path or parts.query or parts.fragment:
            raise ConfigError(
                variable,
                f"a cluster seed list has no database, path or options (seed {seed!r}), "
                f"got {value!r}",
            )
        try:
            port = parts.port
        except ValueError:
            port = -1
        if not parts.hostname or port is None:
            raise ConfigError(
                variable, f"every seed must be host:port ({_CLUSTER_FORM}), got seed {seed!r}"
            )
        if not 1 <= port <= _MAX_PORT:
            raise ConfigError(
                variable, f"seed port must be an integer in 1..65535, got seed {seed!r}"
            )


def redis_key_prefix(value: str, *, variable: str = "REDIS_KEY_PREFIX") -> str:
    """Check a Redis key prefix: it becomes the hash tag of every key (issue 17 item 6).

    ``dto:`` is stored as ``{dto}:...``; a prefix that already holds a hash tag (``{dto}:``) is
    used as given. A prefix starting with ``}`` and holding no tag would make an empty tag.

    Returns:
        ``value`` unchanged.

    Raises:
        ConfigError: the prefix cannot be made a hash tag.
    """
    start = value.find("{")
    has_tag = start >= 0 and value.find("}", start + 1) > start + 1
    if not has_tag and value.startswith("}"):
        raise ConfigError(
            variable, f"must not start with '}}' (it becomes a Redis hash tag), got {value!r}"
        )
    return value


def parse_duration(value: str, *, variable: str) -> float:
    """Parse a Go-style duration (``500ms``, ``30s``, ``1h30m``) into seconds.

    Args:
        value: the text; units ns, us, ms, s, m, h; a bare ``0`` is allowed, other bare numbers
            are not (as in Go).
        variable: the variable named in errors.

    Returns:
        The duration in seconds.

    Raises:
        ConfigError: the text is not a Go duration.
    """
    text = value.strip()
    if not _GO_DURATION.fullmatch(text):
        raise ConfigError(variable, f"not a duration: {value!r} (use e.g. 500ms, 30s, 2m, 1h30m)")
    try:
        return float(durationpy.from_str(text).total_seconds())
    except (durationpy.DurationError, ValueError, OverflowError) as exc:
        raise ConfigError(variable, f"not a duration: {value!r} ({exc})") from None
