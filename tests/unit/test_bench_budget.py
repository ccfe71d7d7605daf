"""The bench's time budget (``benchmarks.run``): a repeat's expected cost, and the Redis-only
peers that run again between dtq's drain runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from benchmarks import run as bench_run
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
