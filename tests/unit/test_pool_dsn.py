"""The pool's DSN: the connect timeout and libpq's TCP bounds are added where the DSN sets none,
so a query in flight to a host that stopped answering fails within seconds (pool.py)."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from dtq.adapters.cockroach.pool import TCP_BOUNDS, pool_dsn


def test_the_bounds_are_added_to_a_dsn_that_sets_none() -> None:
    params = conninfo_to_dict(pool_dsn("postgresql://root@db:26257/dtq", 3.0))

    assert params["connect_timeout"] == "3"
    assert params["tcp_user_timeout"] == "10000"
    assert {name: params[name] for name in TCP_BOUNDS} == {
        name: str(value) for name, value in TCP_BOUNDS.items()
    }
    assert (params["host"], params["port"], params["dbname"]) == ("db", "26257", "dtq")


def test_what_the_dsn_sets_wins() -> None:
    dsn = "host=db dbname=dtq connect_timeout=9 tcp_user_timeout=30000 keepalives=0"
    params = conninfo_to_dict(pool_dsn(dsn, 0.5))

    assert (params["connect_timeout"], params["tcp_user_timeout"]) == ("9", "30000")
    assert params["keepalives"] == "0"
    assert params["keepalives_idle"] == "10"  # what it left out is still added


def test_the_connect_timeout_is_at_least_libpqs_two_seconds() -> None:
    assert conninfo_to_dict(pool_dsn("host=db", 0.5))["connect_timeout"] == "2"
    assert conninfo_to_dict(pool_dsn("host=db", 4.2))["connect_timeout"] == "5"
