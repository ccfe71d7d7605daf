"""Building the Redis client, checking the server's eviction policy, wrapping driver errors.

The client is a ``redis.asyncio.Redis`` for one server, or a ``redis.asyncio.RedisCluster`` for a
``redis+cluster://`` seed list (issue 17 item 6); the adapters use only what both provide
(``RedisClient``). Every key lives under one hash tag (``keys``), so each script and multi-key
command has all its keys in one slot and the cluster client routes it to that slot's master.

No redis-py exception leaves the adapter: ``wrap_errors`` turns driver errors and ``OSError`` into
``BackendUnavailable`` at every call site.

Re-sending: the client itself never re-sends a command (``NO_RETRY``). A command whose reply was
lost may have run on the server, so only a command that has the same effect when run twice may
be re-sent, and the adapter says which ones through ``idempotent``; a pop never is (issue 12
bug 4: a re-sent pop takes other ids and strands the first ones behind their markers).

Timeouts: an unreachable Redis must be noticed in seconds. A connection attempt gives up after
``CONNECT_TIMEOUT`` (2 s), a reply after ``SOCKET_TIMEOUT`` (3 s; ``RedisQueue`` cuts a blocking
pop into BRPOPs of at most 2 s so that a healthy wait never reaches it), and a command that
timed out is not re-sent (a server that did not answer in 3 s would make every re-send wait as
long), so one call costs at most about 3 s while Redis is down.

Cancellation (the push breaker's trial is cut by ``asyncio.timeout`` in the application): a
command cancelled after it was sent may still run and reply once the server answers; that reply
must not be read as the next command's. redis-py (since 4.5.4, CVE-2023-28859) disconnects a
connection whose reply read is interrupted by any ``BaseException``, the connection handshake
included, and ``_InlineSend`` disconnects one whose write is; the pool then reconnects it on
next use. ``tests/integration/test_submit_paused_redis.py`` checks it on a stopped server.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias, TypeVar
from urllib.parse import unquote, urlsplit
from uuid import UUID

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.utils import HIREDIS_AVAILABLE

from dtq.application.aio import wait_within
from dtq.domain.errors import BackendUnavailable

#: redis-py's serializer class, typed as a constructor: since redis 8.2 its ``__init__`` takes
#: unannotated parameters, which mypy --strict refuses to call as such
_new_serializer: Callable[[], HiredisRespSerializer] = HiredisRespSerializer

#: redis-py's hiredis packer (what its synchronous connection uses), when hiredis is installed
_HIREDIS_PACKER: HiredisRespSerializer | None = _new_serializer() if HIREDIS_AVAILABLE else None

T = TypeVar("T")

#: What the adapters are typed against: one server, or a Redis Cluster (``connect_redis``).
RedisClient: TypeAlias = Redis | RedisCluster

DEFAULT_PORT = 6379
CONNECT_TIMEOUT = 2.0  # seconds for one connection attempt
SOCKET_TIMEOUT = 3.0  # seconds to wait for a reply (above the 2 s BRPOP slices it allows)
RESENDS = 3  # most re-sends of an idempotent command after a connection error
NO_RETRY = Retry(NoBackoff(), 0)
_RESEND_BACKOFF = ExponentialWithJitterBackoff(base=0.05, cap=0.5)


#: ``scheme://user:password@`` in a message: masked by ``_reason`` (redis-py's own messages name
#: only ``host:port``; this guards against one that would quote an address with credentials).
_URL_CREDENTIALS = re.compile(r"(\w[\w+.-]*://)[^\s/@]*@")

#: How many characters of a driver error's message ``wrap_errors`` keeps.
REASON_LIMIT = 200


def _reason(exc: BaseException) -> str:
    """``exc``'s message on one line (whitespace runs made one space), URL credentials masked
    (``redis://***@host``), at most ``REASON_LIMIT`` characters; empty when it has none."""
    text = " ".join(str(exc).split())
    return _URL_CREDENTIALS.sub(r"\1***@", text)[:REASON_LIMIT]


@contextmanager
def wrap_errors(operation: str) -> Iterator[None]:
    """Turn driver and socket errors into ``BackendUnavailable``: no redis error escapes.

    The message is ``redis <operation> failed: <class>: <reason>``, the reason being the
    error's own words (a refusal by the server, ``Cluster mode is not enabled on this node``,
    ``invalid username-password pair or user is disabled.``, ``Error 111 connecting to
    host:port``) on one line, at most 200 characters, with any ``user:password@`` of a URL
    masked; just ``redis <operation> failed: <class>`` for an error without words (a timeout).
    A MOVED redirection, which only a one-server client sees (a ``redis://`` or ``host:port``
    address of a Redis Cluster node that does not serve the keys' slot), says what to do:
    ``redis <operation> failed: this Redis is a cluster node (MOVED <slot> <host:port>): set
    REDIS_ADDR=redis+cluster://host:port,...``. The driver error is the ``__cause__``.
    """
    try:
        yield
    except MovedError as exc:
        raise BackendUnavailable(
            f"redis {operation} failed: this Redis is a cluster node (MOVED {_reason(exc)}): "
            "set REDIS_ADDR=redis+cluster://host:port,..."
        ) from exc
    except (RedisError, RedisClusterException, OSError) as exc:
        reason = _reason(exc)
        raise BackendUnavailable(
            f"redis {operation} failed: {type(exc).__name__}" + (f": {reason}" if reason else "")
        ) from exc


async def idempotent(operation: str, call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()`` under ``wrap_errors``, re-sending it after a connection error.

    Only for a command or script that has the same effect when the server runs it twice (its
    first reply may have been lost after it ran): at most ``RESENDS`` re-sends, with jittered
    exponential backoff capped at 0.5 s. A timeout is not re-sent: the server did not answer
    within ``SOCKET_TIMEOUT`` (or could not be reached within ``CONNECT_TIMEOUT``), and each
    re-send would wait as long again.

    Raises:
        BackendUnavailable: every attempt failed, or the error was not a connection error (a
            timeout or a server error reply is never re-sent).
    """
    failures = 0
    while True:
        try:
            with wrap_errors(operation):
                return await call()
        except BackendUnavailable as exc:
            failures += 1
            if failures > RESENDS or not isinstance(exc.__cause__, RedisConnectionError):
                raise
        await asyncio.sleep(_RESEND_BACKOFF.compute(failures))


def parse_uuid(value: bytes | str | None) -> UUID | None:
    """Parse a stored id; None for a missing or malformed value."""
    if value is None:
        return None
    try:
        return UUID(as_text(value))
    except ValueError:
        return None


def ms(seconds: float) -> int:
    """A positive TTL in whole milliseconds (rounded up, at least 1).

    Raises:
        ValueError: ``seconds`` is not positive.
    """
    if seconds <= 0:
        raise ValueError(f"ttl must be > 0 seconds, got {seconds!r}")
    return max(1, math.ceil(seconds * 1000))


def as_text(value: bytes | str) -> str:
    """A reply as ``str`` whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else value


#: URL schemes of a Redis Cluster seed list (``rediss+`` for TLS).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def _host_port(text: str, addr: str) -> tuple[str, int]:
    """``host[:port]`` (IPv6 in brackets; port defaults to 6379). Raises ``ValueError``."""
    parts = urlsplit(f"redis://{text}")
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"invalid Redis address {addr!r}") from exc
    if not host or parts.path or parts.query or parts.fragment or parts.username:
        raise ValueError(f"invalid Redis address {addr!r}; expected host:port")
    return host, port


def parse_cluster_seeds(addr: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """Split a ``redis+cluster://[user:password@]host:port[,host:port...]`` seed list.

    Args:
        addr: the seed list; ``rediss+cluster://`` for TLS. The credentials (percent-encoded)
            apply to every node; each seed's port defaults to 6379.

    Returns:
        The seeds as ``(host, port)``, and the client options the URL implies (``ssl``,
        ``username``, ``password``).

    Raises:
        ValueError: not a cluster URL, no seed, an empty or malformed seed, or a path/query.
    """
    scheme, sep, rest = addr.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Redis Cluster address {addr!r}")
    options: dict[str, Any] = {"ssl": scheme.lower() == "rediss+cluster"}
    credentials, at, hosts = rest.rpartition("@")
    if at:
        username, colon, password = credentials.partition(":")
        if username:
            options["username"] = unquote(username)
        if colon:
            options["password"] = unquote(password)
    seeds = [_host_port(seed, addr) for seed in hosts.split(",")] if hosts else []
    if not seeds:
        raise ValueError(f"invalid Redis Cluster address {addr!r}; expected host:port seeds")
    return seeds, options


class _InlineSend(AbstractConnection):
    """A connection that writes a command in the caller's task.

    redis-py bounds a write with ``asyncio.wait_for`` when the connection has a socket timeout,
    and on Python 3.11 that wraps the write in a task of its own: a task, a timer and one more
    turn of the event loop per command (~25 µs of CPU and ~30 µs of wall time per script call
    on the machines of benchmarks/PROFILE.md, eleventh pass). Here the bytes go to the
    transport at once and only the wait for its buffer to drain is bounded, by
    ``application.aio.wait_within`` (a timer only when the buffer is full); a write that
    cannot drain within ``socket_timeout`` seconds, or fails, closes the connection and raises
    as redis-py's own path does (``TimeoutError``, ``ConnectionError``). Connecting, and a
    connection without a socket timeout, take redis-py's path.
    """

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        timeout = self.socket_timeout
        if not timeout or not self.is_connected:
            await super().send_packed_command(command, check_health)
            return
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]
        writer = self._writer  # read after the health check, which may reconnect
        if writer is None:
            await super().send_packed_command(command, check_health=False)
            return
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            writer.writelines(command)
            await wait_within(timeout, writer.drain())  # a timer only if the buffer is full
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            await self.disconnect(nowait=True)  # a half-written command: never reuse it
            raise

    def pack_command(self, *args: Any) -> list[bytes]:
        """The command in the Redis protocol, packed by redis-py's hiredis packer (in C, as its
        synchronous connection does; its asyncio packer is Python: ARCHITECTURE.md, "Writes in
        the caller's task"). redis-py's asyncio packer without hiredis or with an encoding
        other than UTF-8 (hiredis encodes ``str`` as UTF-8).

        Raises:
            DataError: an argument is not ``str``, ``bytes``, ``int`` or ``float``.
        """
        if _HIREDIS_PACKER is None or self.encoder.encoding != "utf-8":
            return super().pack_command(*args)
        packed: list[bytes] = _HIREDIS_PACKER.pack(*args)
        return packed


class _InlineTcp(_InlineSend, Connection):
    """``Connection`` with ``_InlineSend``'s write."""


class _InlineSsl(_InlineSend, SSLConnection):
    """``SSLConnection`` with ``_InlineSend``'s write."""


class _InlineUnix(_InlineSend, UnixDomainSocketConnection):
    """``UnixDomainSocketConnection`` with ``_InlineSend``'s write."""


_INLINE: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _InlineTcp,
    SSLConnection: _InlineSsl,
    UnixDomainSocketConnection: _InlineUnix,
}


def _send_inline(pool: ConnectionPool) -> None:
    """Make the pool's connections ``_InlineSend`` ones (before it opens any: it creates its
    connections on first use); a connection class of another kind is left as it is."""
    pool.connection_class = _INLINE.get(pool.connection_class, pool.connection_class)


def is_cluster_address(addr: str) -> bool:
    """True for a ``redis+cluster://`` / ``rediss+cluster://`` seed list."""
    scheme, sep, _ = addr.partition("://")
    return bool(sep) and scheme.lower() in CLUSTER_SCHEMES


def connect_redis(addr: str) -> RedisClient:
    """Build a client (hiredis parser, bytes responses); it connects on first use.

    Args:
        addr: ``"host:port"`` as in ``REDIS_ADDR`` (spec §8; port defaults to 6379, IPv6 as
            ``"[::1]:6379"``), a ``redis://`` / ``rediss://`` / ``unix://`` URL, or a Redis
            Cluster seed list ``redis+cluster://host:port,host:port`` (``parse_cluster_seeds``).

    Returns:
        A ``redis.asyncio.Redis``, or for a seed list a ``redis.asyncio.RedisCluster`` (it
        discovers the masters from the seeds on first use and follows MOVED/ASK redirections,
        which a server answers without running the command). Either has a 2 s connect timeout
        (``CONNECT_TIMEOUT``), a 3 s socket read timeout (``SOCKET_TIMEOUT``;
        ``RedisQueue.pop_many`` keeps each BRPOP under it) and no command retries of its own
        (``RedisQueue`` re-sends only idempotent commands, see ``idempotent``; the cluster
        client re-reads the slot map after a connection error, so the next call finds a
        promoted replica), so an outage surfaces as ``BackendUnavailable`` within about 3 s.
        A one-server client writes each command in the caller's task (``_InlineSend``).
        The caller closes it (``aclose()``).

    Raises:
        ValueError: ``addr`` cannot be parsed.
    """
    options: dict[str, Any] = {
        "decode_responses": False,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_timeout": SOCKET_TIMEOUT,
        "retry": NO_RETRY,
    }
    if is_cluster_address(addr):
        seeds, url_options = parse_cluster_seeds(addr)
        nodes = [ClusterNode(host, port) for host, port in seeds]
        return RedisCluster(startup_nodes=nodes, **options, **url_options)
    if "://" in addr:
        client = Redis.from_url(addr, **options)
    else:
        host, port = _host_port(addr, addr)
        client = Redis(host=host, port=port, **options)
    _send_inline(client.connection_pool)
    return client


def socket_timeout(client: RedisClient) -> float | None:
    """The client's socket read timeout in seconds (None: it waits forever)."""
    value = client.get_connection_kwargs().get("socket_timeout")
    return float(value) if value else None


async def check_eviction_policy(client: RedisClient) -> str | None:
    """Warn unless ``maxmemory-policy`` is ``noeviction`` (DESIGN §5: evicted leases mean reruns).

    Args:
        client: the Redis client the queue uses; on a Redis Cluster every master is asked and
            the first that evicts is reported by name (``... is 'allkeys-lru' on master
            10.0.0.2:7000, not 'noeviction' ...``).

    Returns:
        A warning text when the policy evicts keys or cannot be read (CONFIG disabled, renamed
        or not permitted, as on some managed services); None when it is ``noeviction``.

    Raises:
        BackendUnavailable: Redis is unreachable.
    """
    unreadable = (
        "could not read Redis maxmemory-policy ({reason}); make sure it is 'noeviction', or "
        "evicted leases and markers will cause reruns and stalls"
    )
    node: str | None = None  # the cluster master reported
    try:
        with wrap_errors("config_get"):
            if isinstance(client, RedisCluster):  # every master holds a share of the slots
                replies = await client.config_get(
                    "maxmemory-policy", target_nodes=RedisCluster.PRIMARIES
                )
                node, reply = _worst_policy(replies)
            else:
                reply = await client.config_get("maxmemory-policy")
    except BackendUnavailable as exc:
        if isinstance(exc.__cause__, ResponseError):  # CONFIG disabled, renamed or not permitted
            return unreadable.format(reason=f"CONFIG GET refused: {str(exc.__cause__)[:200]}")
        raise
    # The reply maps name -> value; redis-py decodes CONFIG GET to str even with bytes responses.
    raw_policy: bytes | str | None = next(iter(reply.values()), None)
    if raw_policy is None:
        return unreadable.format(reason="no such setting")
    policy = as_text(raw_policy)
    if policy == "noeviction":
        return None
    where = f" on master {node}" if node else ""
    return (
        f"Redis maxmemory-policy is {policy!r}{where}, not 'noeviction': under memory pressure "
        "Redis may evict leases (tasks reclaimed and rerun) and queue entries (delayed until "
        "reconcile)"
    )


def _worst_policy(replies: Any) -> tuple[str | None, dict[Any, Any]]:
    """Of a cluster's per-node CONFIG GET replies (node ``host:port`` -> name -> value), one
    that is not ``noeviction`` if any is (else any one; an empty dict when there is none), with
    its node's name (None when redis-py returned one node's reply without it)."""
    if not isinstance(replies, dict):
        return None, {}
    per_node: list[tuple[str | None, Any]] = [(str(n), r) for n, r in replies.items()]
    if per_node and not all(isinstance(reply, dict) for _, reply in per_node):
        per_node = [(None, replies)]  # one node answered: the reply itself is name -> value
    for node, reply in per_node:
        value = next(iter(reply.values()), None)
        if value is None or as_text(value) != "noeviction":
            return node, reply
    return per_node[0] if per_node else (None, {})
