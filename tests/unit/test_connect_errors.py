"""A database that cannot be reached at start is described in one line (issue 12)."""

from __future__ import annotations

import psycopg
import pytest

from dtq.adapters.cockroach.pool import describe_connect_error

REFUSED = (
    'connection failed: connection to server at "127.0.0.1", port 26257 failed: Connection '
    "refused\n\tIs the server running on that host and accepting TCP/IP connections?"
)
TWO_HOSTS = (
    'connection failed: connection to server at "10.0.0.1", port 26257 failed: Connection '
    'refused\n\tIs the server running?\nconnection to server at "db2" (10.0.0.2), port 26258 '
    "failed: timeout expired"
)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (REFUSED, "connection refused at 127.0.0.1:26257"),
        (TWO_HOSTS, "connection refused at 10.0.0.1:26257; timeout expired at db2:26258"),
        (
            "failed to resolve host 'nowhere.invalid': [Errno -2] Name or service not known",
            "failed to resolve host 'nowhere.invalid': [Errno -2] Name or service not known",
        ),
        (
            'connection is bad: invalid sslmode value: "bogus"',
            'connection is bad: invalid sslmode value: "bogus"',
        ),
    ],
)
def test_a_connect_failure_is_one_line_naming_host_and_port(text: str, line: str) -> None:
    described = describe_connect_error(psycopg.OperationalError(text))

    assert described == line
    assert "\n" not in described
