"""Redis Cluster (issue 17 item 6): the queue on a local three-master cluster, one hash slot for
every key, and the move of a running deployment from the untagged key layout.

The contract suite itself runs on the cluster too (``test_queue_contract.py``, ``redis_cluster``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Monitor

from dtq.adapters.clock import SystemClock
from dtq.adapters.cockroach import CockroachStore
from dtq.adapters.memory.store import InMemoryStore
from dtq.adapters.redis import KeyLayout, RedisQueue, check_eviction_policy, connect_redis
from dtq.adapters.redis.connection import NO_RETRY
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.application.ports import Lease, LeaseState
from dtq.domain.errors import BackendUnavailable
from dtq.domain.status import TaskStatus
from tests.integration.redis_cluster import ClusterUnavailable, LocalCluster, start_cluster
from tests.integration.wiring import api_client, services_on
from tests.single import pop_one

pytestmark = pytest.mark.integration


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _slot_keys(client: RedisCluster, keys: KeyLayout) -> set[str]:
    """Every key in the slot of the layout's hash tag that starts with its prefix."""
    found = await client.cluster_get_keys_in_slot(client.keyslot(keys.scheduled), 1000)
    return {name for name in map(_text, found) if name.startswith(keys.prefix)}


async def test_keys_follow_the_spec_layout_under_the_tag_in_one_slot_of_the_cluster(
    redis_cluster_client: RedisCluster, redis_cluster_prefix: str
) -> None:
    queue = RedisQueue(redis_cluster_client, prefix=redis_cluster_prefix, marker_ttl=30.0)
    keys = KeyLayout(redis_cluster_prefix)
    queued, leased, scheduled = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await queue.enqueue_many([(queued, "high")])
    await queue.set_leases([Lease(leased, "w-1", uuid.uuid4(), 123)], 30.0)
    await queue.schedule(scheduled, "low|tier", datetime(2030, 1, 1, tzinfo=UTC))
    await queue.epoch("token")

    assert await _slot_keys(redis_cluster_client, keys) == {
        f"{{{redis_cluster_prefix[:-1]}}}:queue:ready:high",
        *keys.ready_books("high")[1:],  # its push counter and listed ids (issue 17 item 5)
        keys.marker(queued),
        keys.lease(leased),
        keys.scheduled,
        keys.epoch,
    }
    # PROMOTE_DUE builds the marker, ready-list and books keys in Lua: in the same slot.
    await queue.schedule(scheduled, "low|tier", datetime(2020, 1, 1, tzinfo=UTC))
    assert await queue.promote_due(10) == 1
    assert set(keys.ready_books("low|tier")) <= await _slot_keys(redis_cluster_client, keys)
    assert await pop_one(queue, ["high", "low|tier"], 0) == queued
    assert await pop_one(queue, ["high", "low|tier"], 0) == scheduled


@contextlib.asynccontextmanager
async def _monitoring(cluster: LocalCluster) -> AsyncIterator[dict[int, list[dict[str, str]]]]:
    """MONITOR every master while the block runs; yields port -> the commands it saw (each
    ``{"type": "tcp"|"lua", "command": ...}``; commands a script ran are ``lua``)."""
    seen: dict[int, list[dict[str, str]]] = {port: [] for port in cluster.ports}
    sentinel = f"dtq-monitor-end-{uuid.uuid4().hex}"
    clients = [Redis(port=port) for port in cluster.ports]

    async def watch(port: int, monitor: Monitor) -> None:
        while True:
            info = await monitor.next_command()
            if sentinel in info["command"]:
                return
            seen[port].append({"type": info["client_type"], "command": info["command"]})

    async with contextlib.AsyncExitStack() as stack:
        monitors = [await stack.enter_async_context(client.monitor()) for client in clients]
        watchers = [
            asyncio.create_task(watch(port, monitor))
            for port, monitor in zip(cluster.ports, monitors, strict=True)
        ]
        try:
            yield seen
        finally:
            for client in clients:  # each monitor stops at its node's own sentinel
                await client.echo(sentinel)
            await asyncio.wait_for(asyncio.gather(*watchers), 10.0)
    for client in clients:
        await client.aclose()


async def test_every_key_a_drain_touches_shares_one_slot_on_one_master(
    redis_cluster: LocalCluster,
    redis_cluster_client: RedisCluster,
    redis_cluster_prefix: str,
) -> None:
    queue = RedisQueue(redis_cluster_client, prefix=redis_cluster_prefix, marker_ttl=30.0)
    services = services_on(InMemoryStore(SystemClock()), queue=queue)
    name = redis_cluster_prefix.split(":")[1]  # the test's unique token, in every key
    async with _monitoring(redis_cluster) as seen:
        await queue.epoch("token")
        result = await services.api.submit.submit_job(
            SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(12)))
        )
        popper = asyncio.create_task(queue.pop_many(["high", "default"], 2.0, 4))
        await asyncio.sleep(0.05)  # the pop blocks in BRPOP over both tiers, then takes more
        report = await services.reconciler.reconcile.reconcile_once()  # enqueue_unlisted, TIME
        ids = await popper
        ids += await queue.pop_many(["high", "default"], 0, 16)
        claims = await services.worker.execution.claim_many(ids, "w-1")  # set_leases
        for claim in claims[:2]:
            assert (await services.worker.execution.heartbeat(claim)).value == "extended"
        lease = Lease(uuid.uuid4(), "w-2", uuid.uuid4(), 1)
        assert await queue.recreate_lease(lease, 5.0) is LeaseState.EXTENDED
        assert await queue.leases_present([lease.task_id, claims[0].task.id]) == {
            lease.task_id,
            claims[0].task.id,
        }
        await services.worker.execution.complete_many(claims)  # delete_leases, release_markers
        await queue.schedule(uuid.uuid4(), "low", datetime.now(UTC) - timedelta(seconds=1))
        assert await queue.promote_due(10) == 1
        await queue.server_time()
        await queue.ping()

    assert report.enqueued == 0 and len(claims) == len(result.task_ids) == 12
    touched = {
        port: [arg for entry in entries for arg in entry["command"].split() if name in arg]
        for port, entries in seen.items()
    }
    busy = [port for port, args in touched.items() if args]
    assert len(busy) == 1, "every command on the queue's keys goes to one master"
    args = set(touched[busy[0]])
    slots = {int(await redis_cluster_client.cluster_keyslot(arg)) for arg in args}
    assert slots == {redis_cluster_client.keyslot(KeyLayout(redis_cluster_prefix).scheduled)}
    in_scripts = {
        arg
        for entry in seen[busy[0]]
        if entry["type"] == "lua"
        for arg in entry["command"].split()
        if name in arg
    }
    keys = KeyLayout(redis_cluster_prefix)
    assert keys.ready("low") in in_scripts  # PROMOTE_DUE's own keys were seen too
    assert {keys.scheduled, keys.epoch, keys.ready("default"), keys.ready("high")} <= args
    for claim in claims:
        assert keys.marker(claim.task.id) in args and keys.lease(claim.task.id) in args


async def test_a_blocking_pop_on_the_cluster_waits_past_the_socket_timeout(
    redis_cluster: LocalCluster, redis_cluster_prefix: str
) -> None:
    host, port = "127.0.0.1", redis_cluster.ports[0]
    client = RedisCluster(host=host, port=port, socket_timeout=0.4, retry=NO_RETRY)
    try:
        await client.initialize()
        queue = RedisQueue(client, prefix=redis_cluster_prefix)
        started = time.monotonic()
        assert await queue.pop_many(["default"], 1.0, 8) == []
        assert 0.9 <= time.monotonic() - started < 3.0
        task_id = uuid.uuid4()
        popper = asyncio.create_task(queue.pop_many(["default"], 2.0, 8))
        await asyncio.sleep(0.6)  # past the first BRPOP slice
        await queue.enqueue_many([(task_id, "default")])
        assert await asyncio.wait_for(popper, 3.0) == [task_id]
    finally:
        await client.aclose()


async def test_an_unreachable_cluster_is_backend_unavailable() -> None:
    client = connect_redis("redis+cluster://127.0.0.1:1,127.0.0.1:2")
    queue = RedisQueue(client, prefix="dtqtest:down:")
    try:
        with pytest.raises(BackendUnavailable, match="redis"):
            await queue.ping()
        with pytest.raises(BackendUnavailable, match="redis enqueue_many failed"):
            await queue.enqueue_many([(uuid.uuid4(), "default")])
        with pytest.raises(BackendUnavailable):
            await check_eviction_policy(client)
    finally:
        await client.aclose()


@pytest.fixture
def own_cluster() -> Iterator[LocalCluster]:
    """A cluster of this test's own (about a second to start), for a test that stops a node."""
    try:
        cluster = start_cluster()
    except ClusterUnavailable as exc:
        pytest.skip(f"local Redis Cluster unavailable: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


async def test_healthz_fails_when_the_master_of_the_queues_slot_is_down(
    own_cluster: LocalCluster,
) -> None:
    client = connect_redis(own_cluster.addr)
    assert isinstance(client, RedisCluster)
    try:
        await client.initialize()
        default = client.get_default_node()  # where a keyless PING goes
        assert default is not None
        # A prefix whose slot is served by another master than the one a PING reaches.
        prefix = next(
            prefix
            for prefix in (f"dtqtest:{uuid.uuid4().hex}:" for _ in range(100))
            if own_cluster.master_of(KeyLayout(prefix).epoch) != default.port
        )
        queue = RedisQueue(client, prefix=prefix)
        services = services_on(InMemoryStore(SystemClock()), queue=queue)
        async with api_client(services) as http:
            assert (await http.get("/healthz")).status_code == 200

            own_cluster.stop_node(own_cluster.master_of(KeyLayout(prefix).epoch))
            started = time.monotonic()
            response = await http.get("/healthz")
            took = time.monotonic() - started

        assert response.status_code == 503, response.text
        checks = response.json()["checks"]
        assert checks["store"] == "ok" and checks["queue"] != "ok"
        assert took < 2.0  # /healthz's bound holds (README)
        with pytest.raises(BackendUnavailable, match="redis ping failed"):
            await queue.ping()
    finally:
        await client.aclose()


def _server_addr(client: Redis) -> str:
    """``host:port`` of the one-server test Redis."""
    options = client.get_connection_kwargs()
    return f"{options['host']}:{options['port']}"


async def _failure(addr: str) -> str:
    """What ``RedisQueue.epoch`` (the first call of a reconcile pass) raises on ``addr``."""
    client = connect_redis(addr)
    try:
        with pytest.raises(BackendUnavailable) as raised:
            await RedisQueue(client, prefix="dtqtest:reason:").epoch("token")
        return str(raised.value)
    finally:
        await client.aclose()


async def test_a_cluster_address_of_a_one_server_redis_says_cluster_mode_is_not_enabled(
    redis_client: Redis,
) -> None:
    message = await _failure(f"redis+cluster://{_server_addr(redis_client)}")

    assert message.startswith("redis epoch failed: RedisClusterException: ")
    assert "Cluster mode is not enabled on this node" in message
    assert "\n" not in message


@pytest.mark.parametrize("cluster", [True, False], ids=["cluster", "one-server"])
async def test_refused_credentials_keep_the_servers_words_without_the_password(
    cluster: bool, redis_cluster: LocalCluster, redis_client: Redis
) -> None:
    password = "s3cret-Pa55"
    if cluster:
        addr = f"redis+cluster://nobody:{password}@127.0.0.1:{redis_cluster.ports[0]}"
    else:
        addr = f"redis://nobody:{password}@{_server_addr(redis_client)}"

    message = await _failure(addr)

    assert "invalid username-password pair or user is disabled" in message
    assert password not in message and "\n" not in message and len(message) < 300


async def test_a_one_server_address_of_a_cluster_node_says_to_use_the_cluster_address(
    redis_cluster: LocalCluster,
) -> None:
    port = redis_cluster.ports[0]
    prefix = next(  # keys another master serves: this node answers MOVED
        prefix
        for prefix in (f"dtqtest:{uuid.uuid4().hex}:" for _ in range(100))
        if redis_cluster.master_of(KeyLayout(prefix).epoch) != port
    )
    client = connect_redis(f"redis://127.0.0.1:{port}")
    queue = RedisQueue(client, prefix=prefix)
    try:
        for operation, call in [
            ("ping", queue.ping),
            ("enqueue_many", lambda: queue.enqueue_many([(uuid.uuid4(), "default")])),
        ]:
            with pytest.raises(BackendUnavailable) as raised:
                await call()
            message = str(raised.value)
            assert message.startswith(
                f"redis {operation} failed: this Redis is a cluster node (MOVED "
            ), message
            assert message.endswith(": set REDIS_ADDR=redis+cluster://host:port,...")
    finally:
        await client.aclose()


async def test_the_eviction_check_reads_every_master_of_the_cluster(
    redis_cluster: LocalCluster, redis_cluster_client: RedisCluster
) -> None:
    assert await check_eviction_policy(redis_cluster_client) is None
    last = Redis(port=redis_cluster.ports[-1])
    try:
        await last.config_set("maxmemory-policy", "allkeys-lru")
        warning = await check_eviction_policy(redis_cluster_client)
        assert warning is not None and "'allkeys-lru'" in warning
        # the master at fault, not the seed the log line names (REDIS_ADDR)
        assert f"on master 127.0.0.1:{redis_cluster.ports[-1]}," in warning
    finally:
        await last.config_set("maxmemory-policy", "noeviction")
        await last.aclose()


# --- moving a running deployment to the tagged layout (README "Redis Cluster") ---------------


async def test_after_the_layout_change_the_reconciler_requeues_every_queued_task(
    pg_store: CockroachStore, redis_client: Redis, redis_prefix: str
) -> None:
    """What the README's migration steps rely on: the old deployment's keys (untagged, e.g.
    ``dto:queue:ready:default``) are invisible to the new one; its first reconcile pass finds
    the new keys empty and pushes every due ``queued`` task onto the tagged ready list from the
    database. The documented cleanup (SCAN MATCH ``<prefix>*``) then matches only old keys."""
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    services = services_on(pg_store, queue=queue)
    result = await services.api.submit.submit_job(
        SubmitJob(tasks=tuple(TaskSpec(f"t{i}", "echo") for i in range(5)))
    )
    keys = KeyLayout(redis_prefix)
    # Make what submit wrote look like the old layout: the same names without the hash tag.
    old_ready = f"{redis_prefix}queue:ready:default"
    for task_id in result.task_ids.values():
        await redis_client.set(f"{redis_prefix}queue:pending:{task_id}", "1", px=30_000)
        await redis_client.delete(keys.marker(task_id))
    entries = await redis_client.lrange(keys.ready("default"), 0, -1)
    await redis_client.rpush(old_ready, *entries)
    await redis_client.delete(keys.ready("default"))
    assert await pop_one(queue, ["default"], 0) is None  # the new layout is empty

    report = await services.reconciler.reconcile.reconcile_once()

    assert report.enqueued == 5 and report.queue_reset
    popped = await queue.pop_many(["default"], 0, 10)
    assert set(popped) == set(result.task_ids.values())
    claims = await services.worker.execution.claim_many(popped, "w-new")
    assert {c.task.status for c in claims} == {TaskStatus.RUNNING}
    old = {_text(k) async for k in redis_client.scan_iter(match=f"{redis_prefix}*")}
    assert old and all(not name.startswith(keys.prefix) for name in old)
    assert old_ready in old


async def test_the_documented_cleanup_of_a_tagged_deployment_matches_its_keys_only(
    redis_client: Redis, redis_prefix: str
) -> None:
    """README migration step 3 for an old server already on the tagged layout: SCAN MATCH
    ``{dto}:*`` (braces are literal in Redis's glob) finds every key a deployment leaves that
    does not expire, and nothing of another prefix; the untagged pattern finds none of them."""
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    keys = KeyLayout(redis_prefix)
    await queue.enqueue_many([(uuid.uuid4(), "default")])
    await queue.schedule(uuid.uuid4(), "low", datetime(2030, 1, 1, tzinfo=UTC))
    await queue.epoch("token")
    other = f"{{{redis_prefix[:-1]}x}}:epoch"  # another deployment's tag that starts alike
    await redis_client.set(other, "1", px=30_000)

    found = {_text(k) async for k in redis_client.scan_iter(match=f"{keys.prefix}*")}

    assert {*keys.ready_books("default"), keys.scheduled, keys.epoch} <= found
    assert other not in found and all(name.startswith(keys.prefix) for name in found)
    assert not [k async for k in redis_client.scan_iter(match=f"{redis_prefix}*")]
    await redis_client.delete(other)
