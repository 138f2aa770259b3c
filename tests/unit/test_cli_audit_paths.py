"""``audit --out`` and ``--metrics-file`` are checked before the audit runs: a path that
could not be written afterwards is misuse (exit 2, one line), and no database is read
(the settings here point at none: reaching for it would fail otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.cli.main import main


@pytest.fixture(autouse=True)
def _no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BILLING_LEDGER_DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")


@pytest.mark.parametrize("option", ["--out", "--metrics-file"])
def test_an_output_in_a_missing_directory_is_refused_before_the_audit(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing" / "audit.out"
    assert main(["audit", option, str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"billing-ledger: error: {option} {target}: cannot write there: ")
    assert err.count("\n") == 1


def test_an_output_that_is_a_directory_is_refused_and_nothing_is_left_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--out", str(tmp_path)]) == 2
    said = capsys.readouterr().err
    assert said == f"billing-ledger: error: --out {tmp_path}: it is a directory\n"
    both = ["--metrics-file", str(tmp_path / "ok.prom"), "--out", str(tmp_path)]
    assert main(["audit", *both]) == 2
    assert list(tmp_path.iterdir()) == []
