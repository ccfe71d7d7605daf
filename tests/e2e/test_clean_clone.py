"""The README's first command on a clean clone (issue: a newcomer gets a working dtq)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "clean-clone-check"


@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("git", "make", "curl", "setsid")),
    reason="needs git, make, curl and setsid",
)
def test_make_dev_on_a_clean_clone_completes_a_submitted_job() -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "answered job" in done.stdout and "with completed" in done.stdout
