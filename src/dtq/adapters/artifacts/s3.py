"""The S3-compatible artifact store, on ``obstore`` (Rust ``object_store`` bindings, async).

Objects live at ``<prefix><id>``. An upload streams through ``obstore.put_async`` with an async
iterator, which sends a multipart upload (parts of ``PART_SIZE``) and completes it only after
the last chunk; an exception from the stream aborts it, so no object ever appears half-written.
Reads are ranged ``GET`` s streamed chunk by chunk.

A bucket that does not exist is never taken for a missing artifact: S3 servers answer a
``HEAD`` in it 404 with no body, which obstore raises as the ``FileNotFoundError`` of a missing
key (a ``GET``'s 404 body says ``NoSuchBucket``; SeaweedFS answers a ``PUT`` 403
``AccessDenied``). So a miss, and a refused upload, is checked with :meth:`bucket_exists`, and a
missing bucket is ``BackendUnavailable`` (503) saying so. ``open_services`` checks the bucket at
start.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from datetime import timedelta
from typing import Any

import obstore
from obstore.exceptions import PermissionDeniedError
from obstore.store import S3Store

from dtq.application.artifacts import ArtifactNotFound
from dtq.domain.errors import BackendUnavailable

#: Bytes per multipart part (S3's minimum is 5 MiB for all parts but the last).
PART_SIZE = 8 * 1024 * 1024
#: Smallest chunk yielded when streaming a download.
READ_CHUNK = 1024 * 1024
#: Seconds to open a connection; retries of one request (transient errors, 5xx) and the seconds
#: they may take in all, so an unreachable bucket is a BackendUnavailable (503) within seconds.
CONNECT_TIMEOUT = 5.0
MAX_RETRIES = 3
RETRY_TIMEOUT = 15.0


class S3ArtifactStore:
    """Artifacts as objects of one bucket.

    Args:
        bucket: the bucket (``ARTIFACT_S3_BUCKET``); it must exist (:meth:`bucket_exists`;
            a call in a missing bucket raises ``BackendUnavailable`` saying so).
        endpoint: an S3-compatible endpoint URL (``ARTIFACT_S3_ENDPOINT``), or None for AWS.
        region: the signing region (``AWS_REGION``).
        access_key_id, secret_access_key: credentials (``AWS_ACCESS_KEY_ID`` /
            ``AWS_SECRET_ACCESS_KEY``); None for anonymous requests.
        prefix: key prefix of every artifact object.
    """

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None,
        region: str,
        access_key_id: str | None,
        secret_access_key: str | None,
        prefix: str = "artifacts/",
    ) -> None:
        config: dict[str, Any] = {"region": region}
        if endpoint is not None:
            config["endpoint"] = endpoint
            config["virtual_hosted_style_request"] = False
        if access_key_id and secret_access_key:
            config["access_key_id"] = access_key_id
            config["secret_access_key"] = secret_access_key
        else:
            config["skip_signature"] = True
        client_options: dict[str, Any] = {
            "allow_http": bool(endpoint and endpoint.startswith("http://")),
            "connect_timeout": timedelta(seconds=CONNECT_TIMEOUT),
        }
        retry: dict[str, Any] = {
            "max_retries": MAX_RETRIES,
            "retry_timeout": timedelta(seconds=RETRY_TIMEOUT),
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=2),
                "base": 2,
            },
        }
        self._store = S3Store(
            bucket,
            config=config,  # type: ignore[arg-type]
            client_options=client_options,  # type: ignore[arg-type]
            retry_config=retry,  # type: ignore[arg-type]
        )
        self._prefix = prefix
        self._bucket = bucket

    def _key(self, key: str) -> str:
        return self._prefix + key

    def _unavailable(self, exc: Exception) -> BackendUnavailable:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return BackendUnavailable(f"artifact bucket {self._bucket}: {first}")

    def _no_bucket(self) -> BackendUnavailable:
        return BackendUnavailable(
            f"artifact bucket {self._bucket}: the bucket does not exist (NoSuchBucket): create"
            " it, or set ARTIFACT_S3_BUCKET to one that exists"
        )

    async def bucket_exists(self) -> bool:
        """Whether the bucket exists: one ``LIST`` of the first page under the prefix.

        Returns:
            False when the server answers ``NoSuchBucket``; True when it lists.

        Raises:
            BackendUnavailable: the server could not be asked or refused the listing otherwise
                (unreachable, bad credentials, no list permission).
        """
        try:
            async for _ in obstore.list(self._store, prefix=self._prefix, chunk_size=1):
                break
        except Exception as exc:
            if "NoSuchBucket" in str(exc):
                return False
            raise self._unavailable(exc) from exc
        return True

    async def _not_found(self, key: str, exc: FileNotFoundError) -> Exception:
        """A 404's meaning: ``NoSuchBucket`` (or a bucket :meth:`bucket_exists` does not find)
        is BackendUnavailable; otherwise the artifact is missing."""
        if "NoSuchBucket" in str(exc) or not await self.bucket_exists():
            return self._no_bucket()
        return ArtifactNotFound(f"no artifact {key}", field="id")

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> int:
        """See :meth:`ArtifactStore.put`: one multipart upload, completed at the end."""
        size = 0

        async def counted() -> AsyncIterator[bytes]:
            nonlocal size
            async for chunk in chunks:
                size += len(chunk)
                yield chunk

        failure: BaseException | None = None

        async def guarded() -> AsyncIterator[bytes]:
            nonlocal failure
            try:
                async for chunk in counted():
                    yield chunk
            except BaseException as exc:  # re-raised below, unchanged, after the abort
                failure = exc
                raise

        try:
            await obstore.put_async(self._store, self._key(key), guarded(), chunk_size=PART_SIZE)
        except Exception as exc:
            if failure is not None:
                raise failure from None
            refused = isinstance(exc, FileNotFoundError | PermissionDeniedError)
            if refused and not await self.bucket_exists():  # a 404 or 403 on a missing bucket
                raise self._no_bucket() from exc
            raise self._unavailable(exc) from exc
        return size

    async def open(self, key: str, start: int, length: int | None) -> AsyncIterator[bytes]:
        """See :meth:`ArtifactStore.open`."""
        options: dict[str, Any] = {}
        if start or length is not None:
            options["range"] = {"offset": start} if length is None else (start, start + length)
        try:
            result = await obstore.get_async(self._store, self._key(key), options=options)  # type: ignore[arg-type]
        except FileNotFoundError as exc:
            raise await self._not_found(key, exc) from None
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return self._stream(result)

    async def _stream(self, result: Any) -> AsyncIterator[bytes]:
        try:
            async for chunk in result.stream(min_chunk_size=READ_CHUNK):
                yield bytes(chunk)
        except Exception as exc:
            raise self._unavailable(exc) from exc

    async def stat(self, key: str) -> int:
        """See :meth:`ArtifactStore.stat`."""
        try:
            meta = await obstore.head_async(self._store, self._key(key))
        except FileNotFoundError as exc:
            raise await self._not_found(key, exc) from None
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return int(meta["size"])

    async def delete(self, key: str) -> bool:
        """See :meth:`ArtifactStore.delete` (a HEAD first: S3 deletes are silent)."""
        try:
            await self.stat(key)
        except ArtifactNotFound:
            return False
        try:
            await obstore.delete_async(self._store, self._key(key))
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return True
