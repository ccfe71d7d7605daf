"""``task.artifacts``: the worker runtime's implementation of :class:`dtq.worker.Artifacts`.

It adapts what a handler passes (bytes, a file object, a path, async chunks; a ref or an id) to
the :class:`~dtq.application.artifacts.ArtifactService`. Files are read in :data:`CHUNK` pieces
in a thread, so a large file is never held whole in memory and the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from pathlib import Path
from typing import IO, Any

from dtq.application.artifacts import ArtifactNotFound as StoredArtifactMissing
from dtq.application.artifacts import ArtifactService, InvalidArtifactId
from dtq.worker import ArtifactData, ArtifactNotFound, ArtifactRef

#: Bytes read from a file per chunk.
CHUNK = 1024 * 1024


class TaskArtifacts:
    """:class:`dtq.worker.Artifacts` on an artifact service (one per worker process).

    Args:
        service: the process's artifact service.
    """

    def __init__(self, service: ArtifactService) -> None:
        self._service = service

    async def put(self, data: ArtifactData) -> dict[str, Any]:
        """See :meth:`dtq.worker.Artifacts.put`.

        Raises:
            TypeError: ``data`` is none of the accepted kinds.
            BackendUnavailable: the storage failed (the run fails and is retried by policy).
        """
        info = await self._service.put(chunks(data))
        return info.as_ref()

    async def open(self, ref: ArtifactRef | str) -> AsyncIterator[bytes]:
        """See :meth:`dtq.worker.Artifacts.open`."""
        artifact_id = ref if isinstance(ref, str) else _ref_id(ref)
        try:
            return await self._service.open(artifact_id)
        except (StoredArtifactMissing, InvalidArtifactId) as exc:
            raise ArtifactNotFound(exc.detail) from None


def _ref_id(ref: ArtifactRef) -> str:
    artifact_id = ref.get("artifact_id") if isinstance(ref, Mapping) else None
    if not isinstance(artifact_id, str):
        raise ArtifactNotFound(f"not an artifact ref (no string 'artifact_id'): {ref!r}")
    return artifact_id


async def chunks(data: ArtifactData) -> AsyncIterator[bytes]:
    if isinstance(data, bytes | bytearray | memoryview):
        yield bytes(data)
    elif isinstance(data, os.PathLike):
        handle = await asyncio.to_thread(Path(data).open, "rb")
        try:
            async for chunk in _read_file(handle):
                yield chunk
        finally:
            handle.close()
    elif hasattr(data, "read"):
        async for chunk in _read_file(data):  # type: ignore[arg-type]
            yield chunk
    elif isinstance(data, AsyncIterable):
        async for chunk in data:
            yield bytes(chunk)
    else:
        raise TypeError(
            "task.artifacts.put takes bytes, a binary file, a path or async byte chunks, "
            f"not {type(data).__name__}"
        )


async def _read_file(handle: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(handle.read, CHUNK):
        if not isinstance(chunk, bytes | bytearray):
            raise TypeError("task.artifacts.put needs a file opened in binary mode ('rb')")
        yield bytes(chunk)
