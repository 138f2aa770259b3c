"""promtool, Prometheus's checker of rules and metrics, for the tests that run it.

It is not a Python package: Debian's ``prometheus`` package installs it
(``apt-get install prometheus``), and ``make test`` does so when it is missing
(``infra/debian-packages.sh``). A test
that needs it and does not find it on PATH fails with that instruction rather than
passing unchecked; set ``BILLING_LEDGER_PROMTOOL_OPTIONAL=1`` to skip those tests
instead (on a machine where it cannot be installed; CI never sets it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["OPTIONAL", "promtool"]

OPTIONAL = "BILLING_LEDGER_PROMTOOL_OPTIONAL"
ROOT = Path(__file__).resolve().parents[1]


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` run from the repository's root; fails (or skips, when
    ``OPTIONAL`` is set) when promtool is not installed."""
    path = shutil.which("promtool")
    if path is None:
        missing = "promtool is not on PATH: apt-get install prometheus (it ships promtool)"
        if os.environ.get(OPTIONAL):
            pytest.skip(f"{missing}; skipped because {OPTIONAL} is set")
        pytest.fail(f"{missing}, or set {OPTIONAL}=1 to skip these tests", pytrace=False)
    return subprocess.run(
        [path, *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
