"""The bench's table (``benchmarks.run.build_table``): what the drain's CPU row says."""

from __future__ import annotations

from benchmarks import run as bench_run
from benchmarks.dtq_bench import Result, Sizes


def _drain(**runs: list[float]) -> Result:
    result = Result("drain")
    result.add_run("tasks_per_s", 1_000.0)
    for part in ("workers", "postgres", "redis", "orchestrator"):
        result.add_run(f"cpu_us_per_task_{part}", 100.0)
    for name, values in runs.items():
        for value in values:
            result.add_run(name, value)
    result.settle()
    result.figures["concurrency"] = 256
    return result


def test_the_cpu_row_names_the_checkpoints_during_each_drain() -> None:
    drain = _drain(transactions_checkpoints=[0.0, 2.0, 1.0])

    table, _ = bench_run.build_table({"drain": drain}, [], Sizes())

    [row] = [line for line in table.splitlines() if "CPU µs per task" in line]
    assert "total 400 µs per task" in row
    assert "PostgreSQL checkpoints during each drain: 0 / 2 / 1" in row


def test_without_checkpoint_counts_the_cpu_row_says_nothing_of_them() -> None:
    table, _ = bench_run.build_table({"drain": _drain()}, [], Sizes())

    assert "checkpoints" not in table
