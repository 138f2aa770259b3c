"""``bench charge|outage --plot FILE``: a file that cannot be drawn is refused before the
benchmark starts anything, with the reason and exit status 2 (misuse). Run as a person
would, as a subprocess; no service is started (the bench never gets that far)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "adapters.cli"]


def _bench(which: str, plot: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "bench", which, "--seconds", "1", "--plot", str(plot)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _refused(proc: subprocess.CompletedProcess[str], reason: str) -> None:
    """Exit 2, one line that says why, and nothing from the bench (no step printed)."""
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("billing-ledger: error: --plot: cannot ")
    assert reason in proc.stderr


@pytest.mark.parametrize("which", ["charge", "outage"])
def test_a_plot_in_a_missing_directory_is_refused_before_the_run(
    which: str, tmp_path: Path
) -> None:
    _refused(_bench(which, tmp_path / "nowhere" / "run.svg"), "No such file or directory")
    assert not (tmp_path / "nowhere").exists()


def test_a_plot_onto_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run.svg").mkdir()
    _refused(_bench("outage", tmp_path / "run.svg"), "it is a directory")


def test_a_plot_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("a file, not a directory")
    _refused(_bench("charge", tmp_path / "notes.txt" / "run.png"), "Not a directory")


def test_a_plot_whose_extension_names_no_format_is_refused(tmp_path: Path) -> None:
    _refused(_bench("charge", tmp_path / "run.pdf"), "the extension must be one of .svg, .png")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_plot_file_is_accepted_by_the_check_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    from tools.plots import check_target

    kept = tmp_path / "old.png"
    kept.write_bytes(b"an earlier picture")
    assert check_target(kept) == "png"
    assert kept.read_bytes() == b"an earlier picture"
    assert check_target(tmp_path / "new.SVG") == "svg"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.png"]
