"""The adaptive claim batch of the fetch loop (issue 17 item 2): ``Options.claim_batch`` None
grows the pop while the ready lists stay full and restarts small once they run short."""

from __future__ import annotations

import pytest

from dtq.entrypoints.worker.fetch import ADAPTIVE_CLAIM_MAX, ADAPTIVE_CLAIM_MIN, ClaimBatch
from dtq.worker import Options


def test_full_pops_double_the_batch_up_to_the_cap() -> None:
    batch = ClaimBatch(None)
    sizes = []
    for _ in range(6):
        asked = batch.ask(free=1_000)
        sizes.append(asked)
        batch.popped(asked, asked)
    assert sizes == [32, 64, 128, 256, 256, 256]
    assert (ADAPTIVE_CLAIM_MIN, ADAPTIVE_CLAIM_MAX) == (32, 256)


def test_a_short_pop_restarts_at_the_minimum() -> None:
    batch = ClaimBatch(None)
    for _ in range(3):
        batch.popped(batch.ask(free=1_000), batch.ask(free=1_000))
    assert batch.ask(free=1_000) == 256
    batch.popped(256, 7)
    assert batch.ask(free=1_000) == 32


def test_a_pop_capped_by_free_slots_neither_grows_nor_shrinks_it() -> None:
    batch = ClaimBatch(None)
    batch.popped(32, 32)
    assert batch.ask(free=10) == 10
    batch.popped(10, 10)  # full, but it asked for fewer than the batch: no evidence of more
    assert batch.ask(free=1_000) == 64


def test_a_fixed_batch_never_moves() -> None:
    batch = ClaimBatch(8)
    for got in (8, 8, 0, 8):
        batch.popped(batch.ask(free=100), got)
        assert batch.ask(free=100) == 8
    assert batch.ask(free=3) == 3


def test_options_default_to_the_adaptive_batch_and_refuse_a_zero() -> None:
    assert Options().claim_batch is None
    with pytest.raises(ValueError, match="claim_batch"):
        Options(claim_batch=0)
