"""Submits while Redis hangs (its process stopped with SIGSTOP: connections are accepted and
nothing answers): the push breaker of the submit service makes only the first push after the
commit wait the Redis client's reply timeout; the next submits answer at once, the trial push
after the open period waits no more than the breaker's trial bound, and the reconciler pushes
every committed task once Redis answers again. PostgreSQL plus a throwaway ``redis-server``
this test starts, through the real composition root. Also: a command cut short while Redis
hangs leaves no reply behind for the next command on the adapter's client."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from dtq.adapters.redis import connect_redis
from dtq.application.breaker import PUSH_BREAKER_OPEN_FOR
from dtq.application.commands import SubmitJob, TaskSpec
from dtq.entrypoints.config import Settings
from dtq.entrypoints.container import open_services
from tests.tcp_proxy import free_port

from .conftest import RedisPeek, _unavailable

pytestmark = pytest.mark.integration

#: Seconds the one push that meets the hung Redis may take: the 3 s reply timeout plus room.
FIRST_PUSH_BOUND = 4.5
#: Seconds the trial push of a later open period may take: its own bound (well under a second)
#: plus room; a trial that waited the 3 s reply timeout cannot meet it.
TRIAL_PUSH_BOUND = 2.0


@pytest.fixture
def throwaway_redis() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A ``redis-server`` without persistence on a free port, and the port; killed after."""
    server = shutil.which("redis-server")
    if server is None:
        _unavailable("redis-server is not on PATH")
    port = free_port()
    proc = subprocess.Popen(
        [server or "", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                if Redis(port=port, socket_timeout=1).ping():
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                _unavailable(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield proc, port
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


async def test_submits_answer_at_once_while_redis_hangs(
    pg_dsn: str, throwaway_redis: tuple[subprocess.Popen[bytes], int]
) -> None:
    server, port = throwaway_redis
    prefix = f"t{uuid.uuid4().hex}:"
    settings = Settings(crdb_dsn=pg_dsn, redis_addr=f"127.0.0.1:{port}", redis_key_prefix=prefix)
    missed: list[tuple[str, int]] = []
    async with open_services(
        settings, backend="real", on_push_missed=lambda r, n: missed.append((r, n))
    ) as services:
        submit = services.api.submit
        job = SubmitJob(tasks=(TaskSpec("t", "echo"),))
        await submit.submit_job(job)  # connections open while Redis answers
        os.kill(server.pid, signal.SIGSTOP)

        started = time.monotonic()
        first = await submit.submit_job(job)  # its push waits the reply timeout
        first_took = time.monotonic() - started
        started = time.monotonic()
        later = [await submit.submit_job(job) for _ in range(10)]
        later_took = time.monotonic() - started

        print(f"\nhung Redis: first submit {first_took:.2f}s, 10 more {later_took:.3f}s")
        assert first.created and all(r.created for r in later)
        assert first_took < FIRST_PUSH_BOUND
        assert later_took < PUSH_BREAKER_OPEN_FOR  # none waited on Redis
        assert missed == [("failed", 1)] + [("skipped", 1)] * 10

        await asyncio.sleep(PUSH_BREAKER_OPEN_FOR)  # still hung: the next push is a trial
        started = time.monotonic()
        hung_trial = await submit.submit_job(job)  # given up at the trial bound
        hung_trial_took = time.monotonic() - started
        reopened = await submit.submit_job(job)  # skipped: the failed trial opened it again

        print(f"second open period: trial submit {hung_trial_took:.2f}s")
        assert hung_trial.created and reopened.created
        assert hung_trial_took < TRIAL_PUSH_BOUND
        assert missed[11:] == [("failed", 1), ("skipped", 1)]

        os.kill(server.pid, signal.SIGCONT)
        # 13 without markers, less the cut pushes that still run: Redis reads what sat in the
        # socket once resumed (the first push's script; the trial here is cut in the reconnect's
        # handshake, before its script is sent)
        assert await services.reconciler.reconcile.enqueue_due() in (11, 12, 13)
        await asyncio.sleep(PUSH_BREAKER_OPEN_FOR)
        trial = await submit.submit_job(job)  # pushed: the breaker closes
        assert len(missed) == 13

    client = AsyncRedis(port=port)
    try:
        peek = RedisPeek(client, prefix)
        for result in [first, *later, hung_trial, reopened, trial]:
            assert await peek.has_marker(result.task_ids["t"])
    finally:
        await client.aclose()


async def test_a_command_cut_short_leaves_no_reply_for_the_next_command(
    throwaway_redis: tuple[subprocess.Popen[bytes], int],
) -> None:
    """The push breaker gives up its trial push by cancelling the Redis call
    (``asyncio.timeout``). Redis runs the command once resumed and replies on the connection
    it came by; that reply must not become the answer to the client's next command, so the
    adapter's client (``connect_redis``) drops a connection whose command was cut short."""
    server, port = throwaway_redis
    client = connect_redis(f"127.0.0.1:{port}")
    try:
        await client.set("mine", b"answer")  # the connection is open
        os.kill(server.pid, signal.SIGSTOP)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await client.incr("counter")  # sent; its reply comes only after SIGCONT
        os.kill(server.pid, signal.SIGCONT)

        assert await client.get("mine") == b"answer"
        assert await client.get("counter") == b"1"  # the cut command did run, and replied
    finally:
        await client.aclose()
