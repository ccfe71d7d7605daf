"""A 503 during an outage is one WARNING line per request, without a traceback (issue 12): an
outage must not flood the log with tracebacks. Real 5xx bugs keep theirs
(``test_api_errors.test_unexpected_exception_is_a_generic_500_with_the_traceback_logged``)."""

from __future__ import annotations

import logging
from uuid import uuid4

import pytest

from tests.unit.api_harness import running_api


async def test_a_503_is_logged_once_per_request_as_a_warning_without_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_api() as api:
        api.store.available = False
        with caplog.at_level(logging.DEBUG):
            statuses = [
                (await api.client.post("/v1/tasks", json={"kind": "k"})).status_code,
                (await api.client.get(f"/v1/tasks/{uuid4()}")).status_code,
                (await api.client.get(f"/v1/jobs/{uuid4()}")).status_code,
            ]

    assert statuses == [503, 503, 503]
    assert all(record.exc_info is None for record in caplog.records)
    logged = [r for r in caplog.records if r.name == "dtq.api"]
    assert [r.levelno for r in logged] == [logging.WARNING] * 3
    messages = [r.getMessage() for r in logged]
    assert "POST /v1/tasks -> 503 backend_unavailable" in messages[0]
    assert all(m.endswith(": in-memory store marked unavailable") for m in messages)  # the cause
