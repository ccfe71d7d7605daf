"""``RedisQueue`` under network faults and races that only real Redis shows (issue 12 bugs 1, 4).

A small TCP proxy between the client and Redis can swallow the reply to the next command: the
server has executed it, the client sees its connection close. A pop whose reply was lost must not
be re-sent (the re-send would pop other ids, stranding the first behind their markers), while an
idempotent command may be.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from dtq.adapters.memory.clock import FakeClock
from dtq.adapters.memory.store import InMemoryStore
from dtq.adapters.redis import RedisQueue, connect_redis, tagged_prefix
from dtq.adapters.redis.connection import wrap_errors
from dtq.application.commands import ExecutionPolicy, SubmitJob, TaskSpec
from dtq.application.execution import ExecutionService
from dtq.application.ports import Lease, LeaseState
from dtq.application.submit import SubmitService
from dtq.domain.errors import BackendUnavailable
from tests.single import claim_one

from .conftest import REDIS_URL, RedisPeek

pytestmark = pytest.mark.integration


class ReplyDropper:
    """A TCP proxy to Redis; after ``drop_next_reply()`` the next bytes Redis sends back are not
    passed on: the client's connection is reset instead (a reply lost after execution)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._drop = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def drop_next_reply(self) -> None:
        self._drop = True

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        to_server = asyncio.create_task(self._pump(reader, up_writer, replies=False))
        to_client = asyncio.create_task(self._pump(up_reader, writer, replies=True))
        self._tasks |= {to_server, to_client}
        try:
            await asyncio.wait({to_server, to_client}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (to_server, to_client):
                task.cancel()
            writer.transport.abort()
            up_writer.transport.abort()
            self._tasks -= {to_server, to_client}

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, replies: bool
    ) -> None:
        while data := await source.read(65536):
            if replies and self._drop:
                self._drop = False
                self.dropped += 1
                return  # the reply dies here; _serve resets both connections
            sink.write(data)
            await sink.drain()


@pytest.fixture
async def proxied(
    redis_client: Redis, redis_prefix: str
) -> AsyncIterator[tuple[RedisQueue, ReplyDropper]]:
    """A ``RedisQueue`` on a ``connect_redis`` client that talks to Redis through the proxy."""
    url = urlsplit(REDIS_URL)
    proxy = ReplyDropper(url.hostname or "127.0.0.1", url.port or 6379)
    port = await proxy.start()
    client = connect_redis(f"127.0.0.1:{port}")
    try:
        queue = RedisQueue(client, prefix=redis_prefix, marker_ttl=30.0)
        await queue.ping()  # connected, handshake done: the next reply is a command's
        yield queue, proxy
    finally:
        await client.aclose()
        await proxy.close()


def new_id() -> uuid.UUID:
    return uuid.uuid4()


Pop = Callable[[RedisQueue], Awaitable[Any]]


async def _blmpop(queue: RedisQueue) -> Any:
    """The adapter's blocking pop loop itself: ``pop_many`` runs its pop script first when ids
    wait, so the blocking command is reached here through the adapter's private step."""
    with wrap_errors("pop"):
        deadline = asyncio.get_running_loop().time() + 1.0
        return await queue._pop_blocking(queue._ready_keys(["default"]), deadline, 1)


async def _brpop(queue: RedisQueue) -> Any:
    """The same loop as on Redis < 7.0 (no BLMPOP): BRPOP."""
    queue._blmpop = False
    return await _blmpop(queue)


@pytest.mark.parametrize(
    "pop",
    [
        pytest.param(_blmpop, id="blmpop"),
        pytest.param(_brpop, id="brpop"),
        pytest.param(lambda q: q.pop_many(["default"], 0, 1), id="pop-script"),
        pytest.param(lambda q: q.pop_many(["default"], 1.0, 1), id="pop-many-script"),
    ],
)
async def test_a_pop_whose_reply_was_lost_is_not_sent_again(
    proxied: tuple[RedisQueue, ReplyDropper], redis_client: Redis, redis_prefix: str, pop: Pop
) -> None:
    queue, proxy = proxied
    first, second = new_id(), new_id()
    await queue.enqueue_many([(first, "default"), (second, "default")])

    proxy.drop_next_reply()
    with pytest.raises(BackendUnavailable):
        await pop(queue)

    # The server popped ``first`` (its reply was lost); nothing else was taken on its behalf.
    assert proxy.dropped == 1
    ready = f"{tagged_prefix(redis_prefix)}queue:ready:default"
    assert await redis_client.lrange(ready, 0, -1) == [str(second).encode()]


async def test_an_idempotent_command_whose_reply_was_lost_is_sent_again(
    proxied: tuple[RedisQueue, ReplyDropper], redis_peek: RedisPeek
) -> None:
    queue, proxy = proxied
    task_id = new_id()
    lease = Lease(task_id=task_id, worker_id="w-1", run_id=new_id(), deadline_ms=5)

    proxy.drop_next_reply()
    await queue.set_leases([lease], 30.0)  # re-sent after the lost reply: no error

    assert proxy.dropped == 1
    assert await redis_peek.get_lease(task_id) == lease


async def test_the_queue_epoch_is_read_again_after_a_lost_reply(
    proxied: tuple[RedisQueue, ReplyDropper],
) -> None:
    queue, proxy = proxied
    first = await queue.epoch("token-1")

    proxy.drop_next_reply()
    again = await queue.epoch("token-2")

    assert proxy.dropped == 1
    assert again.id == first.id  # the same data set: the re-sent script created nothing new


async def test_the_queue_clock_is_read_again_after_a_lost_reply(
    proxied: tuple[RedisQueue, ReplyDropper],
) -> None:
    queue, proxy = proxied

    proxy.drop_next_reply()
    await queue.server_time()  # re-sent after the lost reply: no error

    assert proxy.dropped == 1


async def test_heartbeat_on_redis_does_not_overwrite_a_lease_written_after_missing(
    redis_client: Redis, redis_prefix: str, redis_peek: RedisPeek
) -> None:
    # Stages bug 1 on real Redis: A's extend answers MISSING, B's lease lands, A re-creates.
    clock = FakeClock()
    store = InMemoryStore(clock)
    queue = RedisQueue(redis_client, prefix=redis_prefix)
    policy = ExecutionPolicy(lease_duration=30.0)
    submitted = await SubmitService(store=store, queue=queue).submit_job(
        SubmitJob(tasks=(TaskSpec("a", "echo"),))
    )
    task_id = submitted.task_ids["a"]
    claim = await claim_one(
        ExecutionService(store=store, queue=queue, policy=policy), task_id, "w-a"
    )
    assert claim is not None
    lease_key = f"{tagged_prefix(redis_prefix)}lease:task:{task_id}"
    await redis_client.delete(lease_key)  # Redis lost A's lease
    rival = Lease(task_id=task_id, worker_id="w-b", run_id=new_id(), deadline_ms=1)

    class Racing:
        async def extend_leases(self, leases: Sequence[Lease], ttl: float) -> list[LeaseState]:
            states = await queue.extend_leases(leases, ttl)
            await queue.set_leases([rival], ttl)  # B's claim lands between the read and the write
            return states

        def __getattr__(self, attr: str) -> Any:
            return getattr(queue, attr)

    racing = ExecutionService(store=store, queue=Racing(), policy=policy, clock=clock)
    assert await racing.heartbeat(claim) is LeaseState.LOST
    assert await redis_peek.get_lease(task_id) == rival
