"""A throwaway three-master Redis Cluster on free local ports, for the tests (issue 17 item 6).

``start_cluster`` runs three ``redis-server --cluster-enabled yes`` processes (no persistence) in
a temp dir, joins them with ``redis-cli --cluster create ... --cluster-replicas 0``, and waits for
``cluster_state:ok`` on every node; ``LocalCluster.stop`` ends the processes it started and
removes the dir; ``master_of`` names the master serving a key's slot and ``stop_node`` kills one
(for a test on a cluster of its own). The session fixture in ``conftest.py`` starts one per test
session (about a second). Keys are cleaned per slot (``delete_slot_keys``), never by SCAN, which
is per node.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.asyncio import RedisCluster

from dtq.adapters.redis import tagged_prefix
from tests.tcp_proxy import listen_ports

MASTERS = 3
_BUS_OFFSET = 10_000  # Redis Cluster's node-to-node bus listens on port + 10000
_START_TIMEOUT = 20.0  # seconds for the servers to answer and the cluster to reach state ok


class ClusterUnavailable(RuntimeError):
    """The local cluster could not be started (binaries missing, ports, timeout)."""


@dataclass
class LocalCluster:
    """The processes, ports and dir of a running local cluster."""

    directory: Path
    ports: list[int]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def addr(self) -> str:
        """The ``REDIS_ADDR`` seed list of every master (``redis+cluster://...``)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def master_of(self, key: str) -> int:
        """The port of the master that serves ``key``'s hash slot (by ``CLUSTER SLOTS``)."""
        with redis.Redis(port=self.ports[0], socket_timeout=1.0) as client:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            ranges = client.execute_command("CLUSTER SLOTS")  # [start, end, [host, port, ...]]
        for start, end, (_host, port, *_) in ranges:
            if int(start) <= slot <= int(end):
                return int(port)
        raise LookupError(f"no master serves slot {slot}")

    def stop_node(self, port: int) -> None:
        """Stop the server on ``port`` (as a crash would end it: SIGKILL). The cluster stays
        without it: a test that calls this should own its cluster (``start_cluster``)."""
        proc = self.procs[self.ports.index(port)]
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        """Terminate the servers this cluster started (killed after 5 s) and remove its dir."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def _free_ports(count: int) -> list[int]:
    """``count`` ports whose cluster-bus port (+10000) is free too, neither in the ephemeral
    range (an outgoing connection may take such a port before the server binds it)."""
    return listen_ports(count, offset=_BUS_OFFSET)


def _wait(ready: object, what: str, deadline: float) -> None:
    while True:
        try:
            if callable(ready) and ready():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ClusterUnavailable(f"timed out waiting for {what}")
        time.sleep(0.05)


def _ping(port: int) -> bool:
    with redis.Redis(port=port, socket_timeout=1.0, socket_connect_timeout=1.0) as client:
        return bool(client.ping())


def _state_ok(port: int) -> bool:
    with redis.Redis(port=port, socket_timeout=1.0, socket_connect_timeout=1.0) as client:
        info = client.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
        if isinstance(info, dict):
            return info.get("cluster_state") == "ok"
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text


def start_cluster() -> LocalCluster:
    """Start the three masters, create the cluster and wait until it serves every slot.

    Raises:
        ClusterUnavailable: ``redis-server`` or ``redis-cli`` is not on PATH, a server exited,
            ``--cluster create`` failed, or the cluster did not reach ``cluster_state:ok``.
    """
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not server or not cli:
        raise ClusterUnavailable("redis-server and redis-cli are needed for the cluster tests")
    cluster = LocalCluster(
        Path(tempfile.mkdtemp(prefix="dtq-redis-cluster-")), _free_ports(MASTERS)
    )
    try:
        for port in cluster.ports:
            log = (cluster.directory / f"redis-{port}.log").open("wb")
            cluster.procs.append(
                subprocess.Popen(
                    [
                        server,
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        str(cluster.directory / f"nodes-{port}.conf"),
                        "--cluster-node-timeout",
                        "2000",
                        "--dir",
                        str(cluster.directory),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--daemonize",
                        "no",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            log.close()
        deadline = time.monotonic() + _START_TIMEOUT
        for port, proc in zip(cluster.ports, cluster.procs, strict=True):
            _wait(lambda p=port, pr=proc: pr.poll() is None and _ping(p), f"redis {port}", deadline)
        nodes = [f"127.0.0.1:{port}" for port in cluster.ports]
        created = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=_START_TIMEOUT,
            check=False,
        )
        if created.returncode != 0:
            output = (created.stdout + created.stderr).decode(errors="replace").strip()
            raise ClusterUnavailable(f"redis-cli --cluster create failed: {output[-500:]}")
        for port in cluster.ports:
            _wait(lambda p=port: _state_ok(p), f"cluster_state:ok on {port}", deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster


async def delete_slot_keys(client: RedisCluster, prefix: str) -> int:
    """Delete every key of the queue under ``prefix``: all of them share the slot of its hash
    tag, so ``CLUSTER GETKEYSINSLOT`` on that slot finds them all (no per-node SCAN); only
    keys that start with the tagged prefix are deleted. Returns how many were."""
    start = tagged_prefix(prefix)
    slot = client.keyslot(start)
    deleted = 0
    while True:
        found = await client.cluster_get_keys_in_slot(slot, 1000)
        keys = [
            key
            for key in found
            if (key.decode() if isinstance(key, bytes) else key).startswith(start)
        ]
        if not keys:
            return deleted
        deleted += int(await client.delete(*keys))
