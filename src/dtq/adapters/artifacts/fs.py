"""The filesystem artifact store: one file per artifact under a root directory.

Layout: ``<root>/<first two hex digits of the id>/<id>``; uploads are written to
``<root>/.tmp/<id>.<random>.part``, fsynced and renamed into place (``os.replace``, atomic on
one filesystem), so a reader never sees a partial file and an interrupted upload leaves
nothing. File I/O runs in the default thread pool, one chunk at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import BinaryIO

from dtq.application.artifacts import ArtifactNotFound
from dtq.domain.errors import BackendUnavailable

#: Bytes read per chunk when streaming an artifact out.
READ_CHUNK = 1024 * 1024


class FsArtifactStore:
    """Artifacts as files under ``root`` (created on first write).

    Args:
        root: the directory (``ARTIFACT_DIR``). Several processes may share it (e.g. over NFS):
            names are unique and renames atomic.
    """

    def __init__(self, root: Path) -> None:
        self._root = Path(root)

    @property
    def root(self) -> Path:
        """The directory artifacts are stored under."""
        return self._root

    def _path(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef-" for c in key):  # ids are canonical UUIDs
            raise ArtifactNotFound(f"no artifact {key!r}")
        return self._root / key[:2] / key

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        """See :meth:`ArtifactStore.put`: temp file, fsync, rename."""
        final = self._path(key)
        tmp_dir = self._root / ".tmp"
        temp = tmp_dir / f"{key}.{uuid.uuid4().hex}.part"
        try:
            await asyncio.to_thread(tmp_dir.mkdir, parents=True, exist_ok=True)
            handle: BinaryIO = await asyncio.to_thread(temp.open, "xb")
        except OSError as exc:
            raise BackendUnavailable(f"artifact directory {self._root}: {exc}") from exc
        size = 0
        try:
            try:
                async for chunk in chunks:
                    await asyncio.to_thread(handle.write, chunk)
                    size += len(chunk)
                await asyncio.to_thread(_sync_close, handle)
            finally:
                handle.close()
            await asyncio.to_thread(final.parent.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(os.replace, temp, final)
        except OSError as exc:
            await asyncio.to_thread(_unlink, temp)
            raise BackendUnavailable(f"artifact directory {self._root}: {exc}") from exc
        except BaseException:
            await asyncio.shield(asyncio.to_thread(_unlink, temp))
            raise
        return size

    async def open(self, key: str, start: int, length: int | None) -> AsyncIterator[bytes]:
        """See :meth:`ArtifactStore.open`."""
        path = self._path(key)
        try:
            handle: BinaryIO = await asyncio.to_thread(path.open, "rb")
        except FileNotFoundError:
            raise ArtifactNotFound(f"no artifact {key}", field="id") from None
        except OSError as exc:
            raise BackendUnavailable(f"artifact {key}: {exc}") from exc
        return _read(handle, start, length)

    async def stat(self, key: str) -> int:
        """See :meth:`ArtifactStore.stat`."""
        try:
            return (await asyncio.to_thread(self._path(key).stat)).st_size
        except FileNotFoundError:
            raise ArtifactNotFound(f"no artifact {key}", field="id") from None
        except OSError as exc:
            raise BackendUnavailable(f"artifact {key}: {exc}") from exc

    async def delete(self, key: str) -> bool:
        """See :meth:`ArtifactStore.delete`."""
        try:
            await asyncio.to_thread(self._path(key).unlink)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise BackendUnavailable(f"artifact {key}: {exc}") from exc
        return True


async def _read(handle: BinaryIO, start: int, length: int | None) -> AsyncIterator[bytes]:
    try:
        if start:
            await asyncio.to_thread(handle.seek, start)
        remaining = length
        while remaining is None or remaining > 0:
            want = READ_CHUNK if remaining is None else min(READ_CHUNK, remaining)
            chunk = await asyncio.to_thread(handle.read, want)
            if not chunk:
                break
            if remaining is not None:
                remaining -= len(chunk)
            yield chunk
    finally:
        handle.close()


def _sync_close(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
