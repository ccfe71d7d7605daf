"""Redis Cluster (issue 17 item 6): the hash-tagged key layout, the ``REDIS_ADDR`` seed list and
``REDIS_KEY_PREFIX`` checks, ``connect_redis`` choosing the cluster client, and the words of the
driver errors ``wrap_errors`` turns into ``BackendUnavailable``. No network."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from dtq.adapters.redis import KeyLayout, connect_redis, tagged_prefix
from dtq.adapters.redis.connection import (
    SOCKET_TIMEOUT,
    _InlineSend,
    parse_cluster_seeds,
    socket_timeout,
    wrap_errors,
)
from dtq.domain.errors import BackendUnavailable
from dtq.entrypoints.config import ConfigError, load_settings

# --- key layout -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "tagged"),
    [
        ("dto:", "{dto}:"),
        ("dtq", "{dtq}"),
        ("app:dto:", "{app:dto}:"),
        (":", "{:}"),
        ("{dto}:", "{dto}:"),  # already tagged: as given
        ("app:{dto}:", "app:{dto}:"),
        ("{}x:", "{{}x}:"),  # "{}" is no tag: wrapped (the tag is then "{")
    ],
)
def test_the_prefix_becomes_the_hash_tag_unless_it_holds_one(prefix: str, tagged: str) -> None:
    assert tagged_prefix(prefix) == tagged


@pytest.mark.parametrize("prefix", ["", "}x:"])
def test_a_prefix_that_cannot_be_a_hash_tag_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        tagged_prefix(prefix)


def test_every_key_of_the_layout_names_the_spec_key_under_the_tag() -> None:
    keys = KeyLayout("dto:")
    task_id = uuid.UUID("0b4f1b0e-9c1d-4f7e-8a55-3c2e51f0a1d2")

    assert keys.ready("default") == "{dto}:queue:ready:default"
    assert keys.marker(task_id) == f"{{dto}}:queue:pending:{task_id}"
    assert keys.lease(task_id) == f"{{dto}}:lease:task:{task_id}"
    assert keys.scheduled == "{dto}:queue:scheduled"
    assert keys.epoch == "{dto}:epoch"
    assert keys.prefix == "{dto}:"


@pytest.mark.parametrize("prefix", ["dto:", "dtqtest:abc:", "{shared}:", "a:{b}:c:"])
def test_every_key_of_one_prefix_maps_to_one_slot(prefix: str) -> None:
    keys = KeyLayout(prefix)
    ids = [uuid.uuid4() for _ in range(50)]
    names = [keys.scheduled, keys.epoch, *(keys.ready(p) for p in ("high", "default", "x|y"))]
    names += [keys.marker(i) for i in ids] + [keys.lease(i) for i in ids]
    # What PROMOTE_DUE builds in Lua from the prefix in ARGV must hash like KEYS[1].
    names += [f"{keys.prefix}queue:pending:{i}" for i in ids]

    assert len({key_slot(name.encode()) for name in names}) == 1


def test_two_prefixes_usually_land_in_different_slots() -> None:
    slots = {key_slot(KeyLayout(f"tenant-{n}:").scheduled.encode()) for n in range(20)}
    assert len(slots) > 1  # one deployment per slot: tenants spread over the masters


# --- REDIS_ADDR and REDIS_KEY_PREFIX --------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "redis+cluster://h1:7000,h2:7001",
        "redis+cluster://10.0.0.1:7000",
        "rediss+cluster://user:secret@h1:7000,h2:7001,h3:7002",
        "redis+cluster://[::1]:7000,[::1]:7001",
    ],
)
def test_cluster_seed_lists_are_accepted(value: str) -> None:
    assert load_settings({"REDIS_ADDR": value}).redis_addr == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("redis+cluster://", "no seed node"),
        ("redis+cluster://u:p@", "no seed node"),
        ("redis+cluster://h1:7000,", "every seed must be host:port"),
        ("redis+cluster://h1:7000,h2", "every seed must be host:port"),
        ("redis+cluster://h1:7000,:7001", "every seed must be host:port"),
        ("redis+cluster://h1:99999", "seed port must be an integer in 1..65535"),
        ("redis+cluster://h1:x", "seed port must be an integer in 1..65535"),
        ("redis+cluster://h1:7000/0", "no database, path or options"),
        ("redis+cluster://h1:7000?timeout=1", "no database, path or options"),
        ("h1:7000,h2:7001", "several hosts are a Redis Cluster seed list"),
        ("cluster://h1:7000", "URL scheme must be"),
    ],
)
def test_unusable_cluster_addresses_are_refused_with_the_reason(value: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"REDIS_ADDR": value})

    assert caught.value.variable == "REDIS_ADDR"
    assert reason in caught.value.message
    assert "\n" not in str(caught.value)


def test_a_key_prefix_that_would_make_an_empty_hash_tag_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"REDIS_KEY_PREFIX": "}dto:"})

    assert caught.value.variable == "REDIS_KEY_PREFIX"
    assert load_settings({"REDIS_KEY_PREFIX": "{dto}:"}).redis_key_prefix == "{dto}:"
    assert load_settings({}).redis_key_prefix == "dto:"


# --- connect_redis --------------------------------------------------------------------------------


def test_parse_cluster_seeds_reads_seeds_credentials_and_tls() -> None:
    seeds, options = parse_cluster_seeds("rediss+cluster://app:p%40ss@h1:7000,[::1]:7001,h3")

    assert seeds == [("h1", 7000), ("::1", 7001), ("h3", 6379)]
    assert options == {"ssl": True, "username": "app", "password": "p@ss"}
    assert parse_cluster_seeds("redis+cluster://h:1")[1] == {"ssl": False}
    with pytest.raises(ValueError, match="expected host:port"):
        parse_cluster_seeds("redis+cluster://h1:7000,h2:7001/0")


async def test_connect_redis_builds_a_cluster_client_for_a_seed_list() -> None:
    client = connect_redis("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    try:
        assert isinstance(client, RedisCluster)
        assert [(n.host, n.port) for n in client.startup_nodes] == [
            ("127.0.0.1", 7000),
            ("127.0.0.1", 7001),
        ]
        assert client.retry.get_retries() == 0  # re-sends are the adapter's choice
        assert socket_timeout(client) == SOCKET_TIMEOUT
        assert client.get_connection_kwargs()["decode_responses"] is False
    finally:
        await client.aclose()


async def test_connect_redis_keeps_one_server_for_host_port() -> None:
    client = connect_redis("127.0.0.1:6380")
    try:
        assert isinstance(client, Redis)
        assert socket_timeout(client) == SOCKET_TIMEOUT
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("addr", "kind"),
    [
        ("127.0.0.1:6380", Connection),
        ("redis://127.0.0.1:6380/0", Connection),
        ("rediss://127.0.0.1:6380/0", SSLConnection),
        ("unix:///tmp/dtq-test-redis.sock", UnixDomainSocketConnection),
    ],
)
async def test_a_one_server_client_of_any_address_writes_in_the_callers_task(
    addr: str, kind: type[AbstractConnection]
) -> None:
    """Each kind of address keeps its connection kind, with ``_InlineSend``'s write
    (``tests/integration/test_redis_inline_send.py`` checks the write itself)."""
    client = connect_redis(addr)
    try:
        assert isinstance(client, Redis)
        made = client.connection_pool.connection_class
        assert made.__bases__ == (_InlineSend, kind)
        assert client.connection_pool.connection_kwargs["retry"].get_retries() == 0
    finally:
        await client.aclose()


# --- driver errors keep their reason (issue: cluster errors were the bare class name) ----------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            RedisClusterException("Cluster mode is not enabled on this node"),
            "redis ping failed: RedisClusterException: Cluster mode is not enabled on this node",
        ),
        (
            RedisConnectionError("Error 111 connecting to 10.0.0.1:7000.\nConnection refused."),
            "redis ping failed: ConnectionError: Error 111 connecting to 10.0.0.1:7000. "
            "Connection refused.",
        ),
        (
            RedisConnectionError("could not reach redis://app:hunter2@10.0.0.1:7000/0"),
            "redis ping failed: ConnectionError: could not reach redis://***@10.0.0.1:7000/0",
        ),
        (RedisTimeoutError(), "redis ping failed: TimeoutError"),
        (
            OSError(101, "Network is unreachable"),
            "redis ping failed: OSError: [Errno 101] Network is unreachable",
        ),
    ],
)
def test_wrapped_errors_keep_their_reason_on_one_line_without_credentials(
    error: Exception, expected: str
) -> None:
    with pytest.raises(BackendUnavailable) as raised, wrap_errors("ping"):
        raise error

    assert str(raised.value) == expected
    assert raised.value.__cause__ is error


def test_a_wrapped_reason_is_cut_to_200_characters() -> None:
    with pytest.raises(BackendUnavailable) as raised, wrap_errors("ping"):
        raise RedisClusterException("x" * 1000)

    assert str(raised.value) == "redis ping failed: RedisClusterException: " + "x" * 200
