"""Stopping ``dtq dev`` with signals (no services needed: the in-memory backend)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.e2e.conftest import BIN


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_two_quick_sigterms_stop_dev_cleanly(loop: str) -> None:
    """The second signal stops at once, still without an error traceback in the log (uvicorn's
    force_exit skipped the app's lifespan shutdown, which was then logged as an error)."""
    env = {**os.environ, "DTQ_EVENT_LOOP": loop, "LOG_FORMAT": "json"}
    proc = subprocess.Popen(
        [str(BIN / "dtq"), "dev", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    with proc.stdout:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if "curl" in line or not line:
                break
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output = proc.stdout.read()
    assert proc.wait(timeout=30) == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "signal received again" in output
    signal_lines = [line for line in output.splitlines() if "signal received" in line]
    assert signal_lines, output[-3000:]
    assert all('"logger": "dtq.orchestrator"' in line for line in signal_lines), signal_lines
