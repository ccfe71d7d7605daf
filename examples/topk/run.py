"""Submit the top-k job, wait for it, download the CSV:
``python -m examples.topk.run --chunks N --k K --queries Q [--url URL | --dev]``.

With ``--dev`` it starts ``dtq dev --app examples.topk.app:runtime`` on a free port for the run
and stops it afterwards, so one command runs the whole example on one machine. Prints where the
CSV was saved; with ``--verify`` it also compares it with the single-process computation.
Exit status: 0 on success, 1 if the job failed, the CSV differs or the API is unreachable,
2 for a bad option.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from examples.topk import compute

APP = "examples.topk.app:runtime"


def job_spec(chunks: int, k: int, queries: int, sleep: float = 0.0) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body: ``chunks`` chunk tasks and one ``stitch`` depending on all."""
    common = {"k": k, "queries": queries}
    tasks: list[dict[str, Any]] = [
        {
            "name": f"chunk-{i}",
            "kind": "topk.chunk",
            "payload": {**common, "chunk": i, "chunks": chunks, "sleep": sleep},
        }
        for i in range(chunks)
    ]
    tasks.append(
        {
            "name": "stitch",
            "kind": "topk.stitch",
            "payload": common,
            "depends_on": [t["name"] for t in tasks],
        }
    )
    return {"name": f"topk-{chunks}x{k}x{queries}", "tasks": tasks}


def wait_job(client: httpx.Client, job_id: str, timeout: float) -> dict[str, Any]:
    """Poll ``GET /v1/jobs/{id}`` every 0.2 s until it is terminal; TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/v1/jobs/{job_id}")
        response.raise_for_status()
        job: dict[str, Any] = response.json()
        if job["status"] in ("completed", "failed", "cancelled"):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job['status']} after {timeout:g} s")
        time.sleep(0.2)


def run_pipeline(
    url: str,
    chunks: int,
    k: int,
    queries: int,
    out: Path | None,
    *,
    sleep: float = 0.0,
    timeout: float = 300.0,
) -> Path:
    """Submit, wait, download; return the CSV's path. ``DTQ_TOKEN``, when set, is sent as the
    bearer token (an orchestrator's default ``API_AUTH=tokens`` needs one with the ``submit``
    and ``read`` scopes). RuntimeError if the job did not complete (naming the failed task and
    its error)."""
    token = os.environ.get("DTQ_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        response = client.post("/v1/jobs", json=job_spec(chunks, k, queries, sleep))
        if response.status_code >= 400:
            raise RuntimeError(f"submission refused ({response.status_code}): {response.text}")
        job_id = response.json()["job_id"]
        job = wait_job(client, job_id, timeout)
        tasks = {t["name"]: t for t in job["tasks"]}
        if job["status"] != "completed":
            failed = [t for t in job["tasks"] if t["last_error"]]
            why = f"{failed[0]['name']}: {failed[0]['last_error']}" if failed else "no error"
            raise RuntimeError(f"job {job_id} {job['status']} ({why})")
        ref = tasks["stitch"]["result"]["artifact"]
        path = out or Path(f"topk-{job_id}.csv")
        with client.stream("GET", f"/v1/artifacts/{ref['artifact_id']}") as download:
            download.raise_for_status()
            with path.open("wb") as sink:
                for block in download.iter_bytes():
                    sink.write(block)
        return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def dev_server() -> Iterator[str]:
    """``dtq dev`` with the example's runtime on a free port; yields its URL."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtq.entrypoints.cli", "dev", "--app", APP, "--port", str(port)],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dtq dev did not come up")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _positive(text: str) -> int:
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m examples.topk.run", description=__doc__)
    parser.add_argument("--chunks", type=_positive, default=8, help="chunk tasks (default 8)")
    parser.add_argument("--k", type=_positive, default=5, help="neighbours per query (default 5)")
    parser.add_argument("--queries", type=_positive, default=10, help="query rows (default 10)")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds each chunk sleeps")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", default="http://127.0.0.1:8080", help="the orchestrator API")
    where.add_argument("--dev", action="store_true", help="start dtq dev for the run")
    parser.add_argument("--out", type=Path, help="CSV path (default topk-<job id>.csv)")
    parser.add_argument("--verify", action="store_true", help="compare with one process")
    args = parser.parse_args(argv)
    try:
        compute.check_k(args.k)
        compute.query_rows(args.queries, 1797)
        compute.chunk_bounds(0, args.chunks, 1797)
        if not 0 <= args.sleep <= 60:
            raise ValueError(f"sleep must be 0..60 seconds, got {args.sleep:g}")
    except ValueError as exc:
        parser.error(f"--{exc}")
    try:
        with dev_server() if args.dev else contextlib.nullcontext(args.url) as url:
            path = run_pipeline(url, args.chunks, args.k, args.queries, args.out, sleep=args.sleep)
    except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
        print(f"topk: {exc}", file=sys.stderr)
        return 1
    print(f"topk: CSV saved to {path.resolve()}")
    if args.verify:
        if path.read_bytes() != compute.single_process_csv(args.k, args.queries):
            print("topk: the CSV differs from the single-process computation", file=sys.stderr)
            return 1
        print("topk: identical to the single-process computation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
