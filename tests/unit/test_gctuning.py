"""The garbage collector tuning of a worker or orchestrator (``dtq.entrypoints.gctuning``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from dtq.entrypoints import gctuning


@pytest.fixture
def fresh_gc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An untuned process as far as ``tune`` knows; the collector's settings restored after."""
    monkeypatch.setattr(gctuning._Process, "tuned", False)
    before = gc.get_threshold()
    gc.set_threshold(700, before[1], before[2])
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("fresh_gc")
def test_tune_freezes_the_heap_and_raises_the_young_threshold_once() -> None:
    assert gctuning.tune() is True
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == gctuning.GC_THRESHOLD0
    gc.set_threshold(900)
    assert gctuning.tune() is False  # once per process: a later call changes nothing
    assert gc.get_threshold()[0] == 900


@pytest.mark.usefixtures("fresh_gc")
def test_tune_keeps_a_higher_threshold_set_by_the_application() -> None:
    gc.set_threshold(50_000)
    gctuning.tune()
    assert gc.get_threshold()[0] == 50_000
