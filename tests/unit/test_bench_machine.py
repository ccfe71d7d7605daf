"""The bench report's machine line: the CPU named by family and model, the speed probe, the
share of CPU time stolen by the hypervisor (``benchmarks.run``)."""

from __future__ import annotations

import pytest
from benchmarks.run import cpu_model, cpu_ticks, speed_note, speed_probe, stolen_share


def test_the_stolen_share_is_steal_over_the_busy_time_between_two_readings() -> None:
    before = [100, 0, 50, 1_000, 10, 0, 5, 20]
    after = [400, 0, 150, 1_500, 30, 0, 25, 100]  # busy +300 +100 +20 +80 steal; idle, iowait out
    assert stolen_share(before, after) == 80 / 500


def test_no_share_without_two_readings_or_busy_time() -> None:
    assert stolen_share([], [1] * 8) is None
    assert stolen_share([1] * 8, [1] * 8) is None


def test_the_readings_are_the_eight_first_counters_of_proc_stat() -> None:
    ticks = cpu_ticks()
    assert len(ticks) in (0, 8)  # 0 only where there is no /proc/stat
    assert all(t >= 0 for t in ticks)


_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
stepping\t: 1

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel Xeon
stepping\t: 0
"""


def test_the_cpu_is_named_with_the_first_processors_family_model_and_stepping() -> None:
    assert cpu_model(_CPUINFO) == "AMD EPYC, family 26 model 2 stepping 1"


def test_a_cpuinfo_without_ids_gives_the_name_alone_and_without_anything_nothing() -> None:
    assert cpu_model("model name\t: Some CPU\n") == "Some CPU"
    assert cpu_model("") == ""


def test_the_speed_probe_is_the_fastest_of_its_rounds_in_milliseconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readings = iter([0.0, 0.2, 1.0, 1.1, 2.0, 2.3])  # rounds of 0.2, 0.1 and 0.3 s
    monkeypatch.setattr("benchmarks.run.time.perf_counter", lambda: next(readings))
    assert speed_probe(rounds=3) == pytest.approx(100.0)


def test_the_speed_note_gives_both_readings_or_nothing() -> None:
    assert speed_note({"start": 94.6, "end": 121.2}) == (
        "; speed probe 95 ms at the start, 121 ms at the end"
    )
    assert speed_note({"start": 94.6}) == ""
    assert speed_note(None) == ""
