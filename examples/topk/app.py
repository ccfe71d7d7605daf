"""The dtq handlers of the top-k example; run them with
``dtq-worker --app examples.topk.app:runtime`` (or ``dtq dev --app examples.topk.app:runtime``)
from the repository root, which ``--app`` puts on the import path.

Kinds:

- ``topk.chunk``, payload ``{"chunk": i, "chunks": n, "k": k, "queries": q, "sleep": s}``:
  the k nearest rows (squared Euclidean, ties by row index) among chunk i of n to each of the
  q query rows; ``sleep`` (seconds, default 0, at most 60) slows it down for demos and drills.
  Returns ``{"chunk": i, "rows": [start, stop], "topk": [[[distance, row], ...], ...]}``.
- ``topk.stitch``, payload ``{"k": k, "queries": q}``, depending on every chunk task: merges
  the chunks' results from ``task.parents`` into the global top-k, stores it as a CSV artifact
  and returns ``{"artifact": ref, "rows": q * k, "chunks": n}``.

A payload that is not as above fails the task at once (``PermanentError``) naming the field.
"""

from __future__ import annotations

import time
from typing import Any

from dtq.worker import Options, PermanentError, Runtime, Task
from examples.topk import compute

runtime = Runtime(Options(lease_renew_every=0.25, shutdown_grace=0.5))

MAX_SLEEP = 60.0


def _int_field(payload: Any, name: str) -> int:
    if not isinstance(payload, dict):
        raise PermanentError("payload must be a JSON object")
    value = payload.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise PermanentError(f"payload.{name} must be an integer, got {value!r}")
    return value


def _sleep_field(payload: dict[str, Any]) -> float:
    value = payload.get("sleep", 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SLEEP:
        raise PermanentError(f"payload.sleep must be 0..{MAX_SLEEP:g} seconds, got {value!r}")
    return float(value)


@runtime.handler("topk.chunk")
def chunk(task: Task) -> dict[str, Any]:
    """One chunk's top-k per query (see the module docstring); a plain ``def``, run in a
    thread, since the work is CPU-bound."""
    payload = task.payload
    index, chunks = _int_field(payload, "chunk"), _int_field(payload, "chunks")
    k, queries = _int_field(payload, "k"), _int_field(payload, "queries")
    pause = _sleep_field(payload)
    rows, _ = compute.load_rows()
    try:
        compute.check_k(k)
        picked = compute.query_rows(queries, len(rows))
        start, stop = compute.chunk_bounds(index, chunks, len(rows))
    except ValueError as exc:
        raise PermanentError(f"payload.{exc}") from None
    time.sleep(pause)
    topk = compute.chunk_topk(rows, start, stop, picked, k)
    return {"chunk": index, "rows": [start, stop], "topk": [[list(n) for n in q] for q in topk]}


@runtime.handler("topk.stitch")
async def stitch(task: Task) -> dict[str, Any]:
    """Merge every chunk's result into the global top-k, store it as CSV, return its ref."""
    k, queries = _int_field(task.payload, "k"), _int_field(task.payload, "queries")
    rows, labels = compute.load_rows()
    try:
        compute.check_k(k)
        picked = compute.query_rows(queries, len(rows))
    except ValueError as exc:
        raise PermanentError(f"payload.{exc}") from None
    partials = [r for r in task.parents.values() if isinstance(r, dict) and "topk" in r]
    if not partials or len(partials) != len(task.parents):
        raise PermanentError("stitch must depend on topk.chunk tasks only, and on at least one")
    covered = sorted(tuple(p["rows"]) for p in partials)
    expected_start = 0
    for start, stop in covered:
        if start != expected_start:
            raise PermanentError(f"the chunks do not tile the rows: gap or overlap at {start}")
        expected_start = stop
    if expected_start != len(rows):
        raise PermanentError(f"the chunks cover rows 0..{expected_start}, not all {len(rows)}")
    try:
        merged = compute.merge((p["topk"] for p in partials), k)
    except ValueError as exc:
        raise PermanentError(str(exc)) from None
    ref = await task.artifacts.put(compute.to_csv(picked, merged, labels))
    return {"artifact": ref, "rows": sum(len(q) for q in merged), "chunks": len(partials)}
