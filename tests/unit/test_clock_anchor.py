"""The estimate of a try's timestamp from a connection's last reading of the database clock
(``txconn.ClockAnchor``, issue 17 item 4): the reading plus the time elapsed since, none from a
reading older than ``ANCHOR_MAX_AGE``, none for a while after repeated refusals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from dtq.adapters.cockroach import txconn

READING = datetime(2026, 12, 2, 12, 0, tzinfo=timezone(timedelta(hours=1)))


@pytest.fixture
def monotonic(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """This process's monotonic clock, set by the test; estimates on, no refusal counted."""
    monkeypatch.setattr(txconn.ClockAnchor, "refusals", 0)
    monkeypatch.setattr(txconn.ClockAnchor, "off_until", 0.0)
    now = [1000.0]
    monkeypatch.setattr("dtq.adapters.cockroach.txconn.time.monotonic", lambda: now[0])
    return now


def test_an_estimate_is_the_reading_plus_the_time_elapsed_in_utc(monotonic: list[float]) -> None:
    anchor = txconn.ClockAnchor()
    assert anchor.estimate() is None  # nothing read yet
    anchor.know(READING)
    monotonic[0] += 2.5
    estimate = anchor.estimate()
    assert estimate == READING + timedelta(seconds=2.5)
    assert estimate is not None and estimate.tzinfo is UTC


def test_no_estimate_from_a_reading_older_than_the_limit(monotonic: list[float]) -> None:
    anchor = txconn.ClockAnchor()
    anchor.know(READING)
    monotonic[0] += txconn.ANCHOR_MAX_AGE
    assert anchor.estimate() is not None
    monotonic[0] += 0.001
    assert anchor.estimate() is None


def test_a_refusal_forgets_the_reading_and_enough_in_a_row_turn_estimates_off_for_a_while(
    monotonic: list[float],
) -> None:
    anchor, other = txconn.ClockAnchor(), txconn.ClockAnchor()
    other.know(READING)
    for refusal in range(1, txconn.MAX_REFUSALS):
        anchor.know(READING)
        anchor.refused()
        assert anchor.estimate() is None
        assert txconn.ClockAnchor.refusals == refusal
    assert other.estimate() is not None
    anchor.refused()
    assert other.estimate() is None  # off for every connection of the process ...
    monotonic[0] += txconn.ESTIMATES_OFF_FOR - 0.001
    other.know(READING)
    assert other.estimate() is None
    monotonic[0] += 0.001
    assert other.estimate() == READING + timedelta(seconds=0.001)  # ... for a while
    assert txconn.ClockAnchor.refusals == 0


def test_the_reading_of_a_slow_request_is_not_kept(monotonic: list[float]) -> None:
    anchor = txconn.ClockAnchor()
    anchor.know(READING, waited=txconn.READING_MAX_WAIT + 0.001)
    assert anchor.estimate() is None
    anchor.know(READING, waited=txconn.READING_MAX_WAIT)
    later = READING + timedelta(seconds=5)
    anchor.know(later, waited=0.5)  # the earlier reading stays
    monotonic[0] += 1
    assert anchor.estimate() == READING + timedelta(seconds=1)


def test_only_refusals_in_a_row_turn_estimates_off(monotonic: list[float]) -> None:
    anchor = txconn.ClockAnchor()
    for _ in range(3):
        for _ in range(txconn.MAX_REFUSALS - 1):
            anchor.refused()
        txconn.ClockAnchor.accepted()
    anchor.know(READING)
    assert anchor.estimate() == READING
