"""promtool (Debian's ``prometheus`` package) for the operator kit's tests: the executable, or a
skip without it, except under ``CI=true``, where ``.ci/run`` installs it and its absence fails."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def promtool() -> str:
    """The promtool executable; skips without it, fails under ``CI=true``."""
    found = shutil.which("promtool")
    if found is not None:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("promtool is missing under CI=true: .ci/run installs Debian's prometheus")
    pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")


def _said(checked: subprocess.CompletedProcess[bytes]) -> str:
    said = (checked.stdout + checked.stderr).decode().strip()
    return said or ("" if checked.returncode == 0 else f"exit status {checked.returncode}")


def check_metrics(text: str) -> str:
    """What ``promtool check metrics`` says about an exposition ('' when it is silent)."""
    checked = subprocess.run(
        [promtool(), "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=30,
        check=False,
    )
    return _said(checked)


def check_rules(path: Path) -> subprocess.CompletedProcess[bytes]:
    """``promtool check rules PATH``: parses every rule's PromQL expression."""
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, timeout=30, check=False
    )


def check_config(path: Path) -> subprocess.CompletedProcess[bytes]:
    """``promtool check config PATH``: a Prometheus server configuration."""
    return subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, timeout=30, check=False
    )


def run_rule_tests(path: Path) -> subprocess.CompletedProcess[bytes]:
    """``promtool test rules PATH``: runs a rule unit-test file, whose ``rule_files`` are
    resolved from the test file's folder. (Not named ``test_rules``: imported into a test module,
    pytest would collect it as a test.)"""
    return subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, timeout=60, check=False
    )
