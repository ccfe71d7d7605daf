"""The A/B harnesses' round order (``benchmarks.profile_submit.run_order``, also used by
``benchmarks.profile_latency``): whichever variant runs first in a round reads slower, so the
order alternates round by round."""

from __future__ import annotations

from pathlib import Path

from benchmarks.profile_submit import Variant, run_order


def _names(variants: list[Variant]) -> list[str]:
    return [v.name for v in variants]


def test_rounds_alternate_the_order_of_the_variants() -> None:
    base, new = Variant("base", Path("/b")), Variant("new", Path("/n"))
    rounds = [_names(run_order([base, new], run)) for run in range(4)]
    assert rounds == [["base", "new"], ["new", "base"], ["base", "new"], ["new", "base"]]


def test_over_an_even_number_of_rounds_each_variant_runs_first_equally_often() -> None:
    variants = [Variant(name, Path("/" + name)) for name in ("a", "b", "c")]
    firsts = [run_order(variants, run)[0].name for run in range(6)]
    assert firsts.count("a") == firsts.count("c") == 3
    assert run_order(variants, 1) == list(reversed(variants))


def test_one_variant_is_run_every_round() -> None:
    only = Variant("here", Path("/h"))
    assert [run_order([only], run) for run in range(3)] == [[only]] * 3
