"""Parsing and checking single configuration values: Go durations, listen and Redis addresses.

Every error is a :class:`ConfigError` naming the variable, one line, so the CLI can print it and
exit 2. :mod:`dtq.entrypoints.config` re-exports all of this.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import durationpy

# Go's time.ParseDuration grammar: an optional sign, then one or more decimal numbers each with
# a unit; or the bare "0". durationpy alone is more lenient (it takes "1d" and "1h-5m"). Digits
# are ASCII only ([0-9], not \d): Go and the docs mean 0-9, while \d and int() also take
# fullwidth or Arabic-Indic digits.
_GO_DURATION = re.compile(
    r"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+|[-+]?0"
)
#: A decimal integer as dtq accepts one: optional sign, ASCII digits (no "_", no Unicode digits).
_ASCII_INTEGER = re.compile(r"[-+]?[0-9]+")
_MAX_PORT = 65535
_REDIS_SCHEMES = ("redis", "rediss", "unix")


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
    """Check a Redis address: ``host:port`` (spec §8) or a redis, rediss or unix URL.

    Args:
        value: the address; IPv6 hosts in brackets (``[::1]:6379``).
        variable: the variable named in errors.

    Returns:
        ``value`` unchanged.

    Raises:
        ConfigError: spaces, no host, no port (``host:port`` form), a port outside 1..65535,
            or a URL scheme other than the three above.
    """
    if any(ch.isspace() for ch in value):
        raise ConfigError(variable, f"must not contain spaces, got {value!r}")
    scheme, sep, _ = value.partition("://")
    if sep and scheme.lower() not in _REDIS_SCHEMES:
        allowed = "|".join(f"{s}://" for s in _REDIS_SCHEMES)
        raise ConfigError(variable, f"URL scheme must be {allowed}, got {value!r}")
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
