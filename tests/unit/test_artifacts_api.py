"""``/v1/artifacts`` on the filesystem store: upload, whole and ranged download, HEAD, errors."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.api_harness import SETTINGS, Api, running_api

LIMIT = 64 * 1024


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    settings = replace(SETTINGS, artifact_dir=tmp_path / "artifacts", api_max_artifact_bytes=LIMIT)
    async with running_api(settings) as running:
        yield running


async def _upload(api: Api, data: bytes, content_type: str = "image/png") -> dict[str, object]:
    response = await api.client.post(
        "/v1/artifacts", content=data, headers={"Content-Type": content_type}
    )
    assert response.status_code == 201, response.text
    body: dict[str, object] = response.json()
    return body


async def test_upload_any_content_type_returns_id_size_sha256(api: Api) -> None:
    data = bytes(range(256)) * 100
    body = await _upload(api, data, "application/x-anything")
    assert body["size"] == len(data)
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert uuid.UUID(str(body["artifact_id"]))


async def test_upload_larger_than_json_body_limit_is_accepted(tmp_path: Path) -> None:
    """API_MAX_BODY_BYTES (the JSON routes' limit) does not apply to artifacts."""
    settings = replace(
        SETTINGS, artifact_dir=tmp_path, api_max_body_bytes=1024, api_max_artifact_bytes=LIMIT
    )
    async with running_api(settings) as api:
        body = await _upload(api, b"x" * 10_000)
    assert body["size"] == 10_000


async def test_download_whole_streams_the_bytes(api: Api) -> None:
    data = b"hello artifacts " * 1000
    ref = await _upload(api, data)
    response = await api.client.get(f"/v1/artifacts/{ref['artifact_id']}")
    assert response.status_code == 200
    assert response.content == data
    assert response.headers["content-length"] == str(len(data))
    assert response.headers["accept-ranges"] == "bytes"


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [("bytes=10-19", 10, 19), ("bytes=100-", 100, 999), ("bytes=-5", 995, 999),
     ("bytes=990-5000", 990, 999)],
)  # fmt: skip
async def test_range_gives_206_with_content_range(
    api: Api, header: str, start: int, end: int
) -> None:
    data = bytes(i % 251 for i in range(1000))
    ref = await _upload(api, data)
    response = await api.client.get(
        f"/v1/artifacts/{ref['artifact_id']}", headers={"Range": header}
    )
    assert response.status_code == 206
    assert response.content == data[start : end + 1]
    assert response.headers["content-range"] == f"bytes {start}-{end}/1000"


@pytest.mark.parametrize("header", ["bytes=10-20", "bytes=100-", "bytes=-0"])
async def test_a_range_outside_the_artifact_is_416_naming_range(api: Api, header: str) -> None:
    ref = await _upload(api, b"0123456789")
    response = await api.client.get(
        f"/v1/artifacts/{ref['artifact_id']}", headers={"Range": header}
    )
    assert response.status_code == 416
    assert response.headers["content-range"] == "bytes */10"
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("range_not_satisfiable", "Range")
    assert "10 bytes" in error["message"]


@pytest.mark.parametrize("header", ["bytes=5-2", "items=0-1", "bytes=0-1,4-5", "bytes=-", "x"])
async def test_malformed_range_is_400_naming_range(api: Api, header: str) -> None:
    ref = await _upload(api, b"0123456789")
    response = await api.client.get(
        f"/v1/artifacts/{ref['artifact_id']}", headers={"Range": header}
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "Range"


async def test_head_gives_size(api: Api) -> None:
    ref = await _upload(api, b"z" * 1234)
    response = await api.client.head(f"/v1/artifacts/{ref['artifact_id']}")
    assert response.status_code == 200
    assert response.headers["content-length"] == "1234"
    assert response.content == b""


async def test_head_sends_the_headers_get_sends(api: Api) -> None:
    ref = await _upload(api, b"z" * 10)
    url = f"/v1/artifacts/{ref['artifact_id']}"
    got, headed = await api.client.get(url), await api.client.head(url)
    names = ("content-type", "content-length", "accept-ranges")
    assert [headed.headers.get(n) for n in names] == [got.headers.get(n) for n in names]


async def test_unknown_id_is_404_and_bad_id_400_both_naming_id(api: Api) -> None:
    unknown = await api.client.get(f"/v1/artifacts/{uuid.uuid4()}")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "artifact_not_found"
    # the path parameter is {id}, as on /v1/tasks/{id} and /v1/jobs/{id}
    assert unknown.json()["error"]["field"] == "id"
    assert (await api.client.head(f"/v1/artifacts/{uuid.uuid4()}")).status_code == 404
    ranged = await api.client.get(f"/v1/artifacts/{uuid.uuid4()}", headers={"Range": "bytes=0-1"})
    assert (ranged.status_code, ranged.json()["error"]["field"]) == (404, "id")
    bad = await api.client.get("/v1/artifacts/not-a-uuid")
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == "id"


async def test_too_large_upload_is_413_and_leaves_nothing(api: Api, tmp_path: Path) -> None:
    response = await api.client.post("/v1/artifacts", content=b"x" * (LIMIT + 1))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()] == []


async def test_openapi_lists_the_artifact_routes(api: Api) -> None:
    paths = (await api.client.get("/schema/openapi.json")).json()["paths"]
    assert set(paths["/v1/artifacts"]) == {"post"}
    assert {"get", "head"} <= set(paths["/v1/artifacts/{id}"])


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST"])
async def test_a_query_parameter_is_refused_naming_it(api: Api, method: str) -> None:
    ref = await _upload(api, b"0123456789")
    url = "/v1/artifacts?x=1" if method == "POST" else f"/v1/artifacts/{ref['artifact_id']}?x=2"

    response = await api.client.request(method, url, content=b"abc" if method == "POST" else None)

    assert response.status_code == 400
    if method != "HEAD":  # HEAD has no body to carry the error
        assert response.json()["error"]["field"] == "x"
