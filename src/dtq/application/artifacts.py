"""Artifacts: large inputs and outputs stored by reference (issue 13 item 4).

An artifact is an immutable byte string under a server-chosen id (a UUID in its canonical text
form). :class:`ArtifactStore` is the port the storage adapters implement (a directory, or an
S3-compatible bucket); :class:`ArtifactService` is what the API and the worker runtime call: it
chooses the id, counts and hashes the bytes as they stream through, and validates ids and ranges.
Nothing here keeps an artifact's bytes in memory beyond one chunk.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from dtq.domain.errors import NotFound, ValidationError

__all__ = [
    "ArtifactInfo",
    "ArtifactNotFound",
    "ArtifactService",
    "ArtifactStore",
    "InvalidArtifactId",
    "parse_artifact_id",
]


class ArtifactNotFound(NotFound):
    """No artifact has this id."""

    code = "artifact_not_found"


class InvalidArtifactId(ValidationError):
    """An artifact id must be a UUID."""

    code = "invalid_artifact_id"


@dataclass(frozen=True, slots=True)
class ArtifactInfo:
    """What a stored artifact is known by; :meth:`as_ref` is its plain-JSON reference.

    Attributes:
        artifact_id: the artifact's id, a canonical UUID string.
        size: its length in bytes.
        sha256: the lowercase hex SHA-256 of its bytes.
    """

    artifact_id: str
    size: int
    sha256: str

    def as_ref(self) -> dict[str, str | int]:
        """``{"artifact_id": ..., "size": ..., "sha256": ...}``: storable in payloads/results."""
        return {"artifact_id": self.artifact_id, "size": self.size, "sha256": self.sha256}


class ArtifactStore(Protocol):
    """Where artifact bytes live. Keys are canonical UUID strings (already validated).

    Adapters wrap their driver's errors as ``BackendUnavailable``; a key that is not stored
    raises :class:`ArtifactNotFound` naming ``id``, as :func:`parse_artifact_id` names a
    malformed one.
    """

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        """Store ``chunks`` under ``key`` atomically and return the byte count written.

        Readers never see a partial object: the bytes go to a temporary name (or an
        uncompleted multipart upload) first. If ``chunks`` raises, nothing is left under
        ``key`` or any temporary name, and the exception propagates unchanged.
        """
        ...

    async def open(self, key: str, start: int, length: int | None) -> AsyncIterator[bytes]:
        """Stream ``length`` bytes (all to the end when None) from byte ``start``.

        The caller checked ``0 <= start < size``. Raises ArtifactNotFound before the first
        chunk when ``key`` is not stored.
        """
        ...

    async def stat(self, key: str) -> int:
        """The stored size in bytes of ``key``; raises ArtifactNotFound."""
        ...

    async def delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed. Idempotent."""
        ...


def parse_artifact_id(text: str, *, field: str = "id") -> str:
    """The canonical form of an artifact id.

    Raises:
        InvalidArtifactId: ``text`` is not a UUID (naming ``field``).
    """
    try:
        return str(uuid.UUID(text))
    except (ValueError, TypeError, AttributeError):
        raise InvalidArtifactId(f"artifact id must be a UUID, got {text!r}", field=field) from None


class ArtifactService:
    """Upload, read, size and delete artifacts through an :class:`ArtifactStore`.

    Args:
        store: the storage adapter.
    """

    def __init__(self, *, store: ArtifactStore) -> None:
        self._store = store

    async def put(self, chunks: AsyncIterable[bytes]) -> ArtifactInfo:
        """Store a new artifact from a stream of byte chunks, under a fresh id.

        Returns:
            Its id, size and SHA-256.

        Raises:
            BackendUnavailable: the storage failed; whatever ``chunks`` raised (the upload
            is then discarded whole).
        """
        artifact_id = str(uuid.uuid4())
        digest = hashlib.sha256()

        async def hashed() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                if chunk:
                    digest.update(chunk)
                    yield bytes(chunk)

        size = await self._store.put(artifact_id, hashed())
        return ArtifactInfo(artifact_id=artifact_id, size=size, sha256=digest.hexdigest())

    async def stat(self, artifact_id: str) -> int:
        """Size in bytes. Raises InvalidArtifactId, ArtifactNotFound."""
        return await self._store.stat(parse_artifact_id(artifact_id))

    async def open(
        self, artifact_id: str, start: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """Stream the artifact's bytes, or ``length`` of them from ``start``.

        The caller checks the range against :meth:`stat` (the API answers 416 outside it).

        Raises:
            InvalidArtifactId: not a UUID.
            ArtifactNotFound: no such artifact.
        """
        key = parse_artifact_id(artifact_id)
        return await self._store.open(key, start, length)

    async def delete(self, artifact_id: str) -> bool:
        """Remove an artifact; True if it existed. Raises InvalidArtifactId."""
        return await self._store.delete(parse_artifact_id(artifact_id))
