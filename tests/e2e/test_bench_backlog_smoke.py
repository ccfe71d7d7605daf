"""``make bench-backlog`` (``benchmarks.backlog``) runs to its table on a small backlog.

The scenario is opt-in and slow at its default million tasks, so only this smoke run keeps it
working: it broke unnoticed once when a statement it explains (``sql.DUE_QUEUED_AFTER``) lost
a parameter. Real orchestrator, workers, PostgreSQL and Redis, as the scenario uses them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_the_backlog_scenario_runs_to_its_figures(
    database: str, redis_prefix: str, tmp_path: Path
) -> None:
    """A 3,000-task backlog in jobs of 1,000: every section runs and writes its figures."""
    out = tmp_path / "backlog.json"
    sizes = ["--tasks", "3000", "--job-size", "1000", "--window", "1000"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.backlog", *sizes, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    figures = json.loads(out.read_text())
    assert figures["backlog"]["tasks"] == 3000
    assert figures["backlog"]["explain_ms"], figures["backlog"]
