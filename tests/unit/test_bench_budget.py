"""The bench's time budget (``benchmarks.run``): a repeat's expected cost, and the Redis-only
peers that run again between dtq's drain runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks import dtq_bench
from benchmarks import run as bench_run
from benchmarks.common import Drain
from benchmarks.dtq_bench import Sizes
from benchmarks.peers import Peer, PeerResult


def test_a_repeat_of_a_known_cost_runs_only_if_it_fits_what_is_left() -> None:
    more = bench_run.Budget(100.0, ["drain"]).section("drain")()

    assert more(next_cost=1.0)
    assert not more(next_cost=1_000.0)


def test_only_the_peers_that_could_be_the_fastest_run_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rates = {"huey": 3_000.0, "dramatiq": 2_000.0, "celery": 900.0, "rq": 200.0}
    ran: list[str] = []

    def run_peer(peer: Peer, n: int, runs: int, logs: Path, **_: Any) -> PeerResult:
        ran.append(peer.name)
        return PeerResult(peer, "ok", rates=[rates[peer.name]])

    monkeypatch.setattr(bench_run, "run_peer", run_peer)
    outcome = bench_run.Outcome()
    between = bench_run._interleaved_peers(Sizes(), tmp_path, set(rates), outcome)

    between(0)
    first = list(ran)
    ran.clear()
    between(1)

    assert sorted(first) == sorted(rates)
    assert sorted(ran) == ["dramatiq", "huey"]  # celery and rq are under half of huey's rate
    by_name = {p.peer.name: p for p in outcome.peers}
    assert by_name["huey"].rates == [3_000.0, 3_000.0]
    assert by_name["rq"].rates == [200.0]
    assert "not repeated" in by_name["rq"].detail


def test_each_drain_round_measures_the_defaults_among_the_variants_and_then_runs_the_peers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rates = {64: [1_000.0, 1_100.0, 900.0], 256: [3_000.0, 3_300.0, 3_100.0]}
    tuned = iter([2_000.0, 4_000.0, 3_500.0])
    order: list[str] = []

    @contextlib.contextmanager
    def cluster(tag: str, logs: Path) -> Iterator[object]:
        yield object()

    def drain(c: object, body: object, conc: int, timeout: float, **env: str) -> Drain:
        label = f"c{conc}" + (" tuned" if env else "")
        order.append(label)
        rate = next(tuned) if env else rates[conc].pop(0)
        cpu = {"workers": rate / 10} if not env and conc == 256 else {}
        return Drain(tasks=int(rate), started=0.0, finished=1.0, launched=0.0, cpu=cpu)

    def between(run: int) -> float:
        order.append(f"peers {run}")
        return 5.0

    asked: list[float | None] = []

    def more(next_cost: float | None = None) -> bool:
        asked.append(next_cost)
        return True

    monkeypatch.setattr(dtq_bench, "cluster", cluster)
    monkeypatch.setattr(dtq_bench, "_drain", drain)
    monkeypatch.setattr(dtq_bench, "TUNED", {"claim_batch=128": {"BENCH_CLAIM_BATCH": "128"}})
    sizes = Sizes(concurrencies=(64, 256))

    result = dtq_bench.bench_drain(sizes, 3, tmp_path, more, between)

    round_ = ["c64", "c256", "c256 tuned"]
    assert order == [*round_, "peers 0", *round_, "peers 1", *round_, "peers 2"]
    assert result.runs["tasks_per_s"] == [3_000.0, 3_300.0, 3_100.0]
    assert result.figures["tasks_per_s"] == 3_100.0
    assert result.figures["cpu_us_per_task_workers"] == 310.0
    assert result.figures["defaults_vs_tuned"] == pytest.approx(3_100.0 / 3_500.0)
    assert len(asked) == 2 and all(cost is not None and cost >= 5.0 for cost in asked)


def test_the_drain_stops_its_rounds_when_the_next_one_does_not_fit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    @contextlib.contextmanager
    def cluster(tag: str, logs: Path) -> Iterator[object]:
        yield object()

    drains: list[int] = []

    def drain(c: object, body: object, conc: int, timeout: float, **env: str) -> Drain:
        drains.append(conc)
        return Drain(tasks=1_000, started=0.0, finished=1.0, launched=0.0)

    monkeypatch.setattr(dtq_bench, "cluster", cluster)
    monkeypatch.setattr(dtq_bench, "_drain", drain)

    result = dtq_bench.bench_drain(Sizes(), 3, tmp_path, lambda next_cost=None: False)

    assert result.runs["tasks_per_s"] == [1_000.0]
    assert drains == [64, 256, 512, 256]  # one round: the sweep is cut with the measured runs
    assert "1 of 3 rounds (time budget)" in result.notes
