"""``make mutate``'s verdict (tools/mutation_report.py) on hand-made mutmut results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.mutation_report import main

KILLED, SURVIVED, NO_TESTS = 1, 0, 33


def _meta(root: Path, path: str, codes: dict[str, int]) -> None:
    meta = root / "mutants" / f"{path}.meta"
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}))


def _mutants(module: str, killed: int, survived: int = 0, no_tests: int = 0) -> dict[str, int]:
    codes = [KILLED] * killed + [SURVIVED] * survived + [NO_TESTS] * no_tests
    return {f"{module}.x_f__mutmut_{i + 1}": code for i, code in enumerate(codes)}


def _run(
    tmp_path: Path, equivalent: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    readme = tmp_path / "README.md"
    readme.write_text("".join(f"| `{name}` | change | why |\n" for name in equivalent))
    code = main(["--mutants", str(tmp_path / "mutants"), "--equivalent", str(readme)])
    return code, capsys.readouterr().out


def test_every_file_at_threshold_and_domain_survivors_equivalent_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _meta(tmp_path, "domain/money.py", _mutants("domain.money", 99, survived=1))
    _meta(tmp_path, "adapters/charging/pusher.py", _mutants("adapters.charging.pusher", 9, 1))
    code, out = _run(tmp_path, ["domain.money.x_f__mutmut_100"], capsys)
    assert code == 0, out
    assert "domain/ (total)" in out and "adapters/ (total)" in out
    assert "1 mutants of adapters/ not killed" in out
    assert "adapters.charging.pusher.x_f__mutmut_10" in out
    assert "OK: domain/ 100.0% killed" in out


def test_a_money_path_file_below_ninety_percent_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _meta(tmp_path, "domain/money.py", _mutants("domain.money", 10))
    _meta(tmp_path, "adapters/stripe/client.py", _mutants("adapters.stripe.client", 8, 1, 1))
    code, out = _run(tmp_path, [], capsys)
    assert code == 1
    assert "below the 90% a file must reach" in out


def test_equivalent_adapter_mutants_do_not_count_against_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _meta(tmp_path, "domain/money.py", _mutants("domain.money", 10))
    _meta(tmp_path, "adapters/stripe/client.py", _mutants("adapters.stripe.client", 8, 2))
    names = ["adapters.stripe.client.x_f__mutmut_9", "adapters.stripe.client.x_f__mutmut_10"]
    code, out = _run(tmp_path, names, capsys)
    assert code == 0, out
    assert "100.0%" in out.splitlines()[2]


def test_a_domain_survivor_not_judged_equivalent_fails_even_above_the_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _meta(tmp_path, "domain/money.py", _mutants("domain.money", 99, survived=1))
    _meta(tmp_path, "adapters/charging/pusher.py", _mutants("adapters.charging.pusher", 10))
    code, out = _run(tmp_path, [], capsys)
    assert code == 1
    assert "1 mutants of domain/ not killed and not judged equivalent" in out
    assert "domain.money.x_f__mutmut_100" in out


def test_domain_below_its_total_threshold_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _meta(tmp_path, "domain/a.py", _mutants("domain.a", 100))
    _meta(tmp_path, "domain/b.py", _mutants("domain.b", 9, no_tests=1))
    _meta(tmp_path, "adapters/charging/pusher.py", _mutants("adapters.charging.pusher", 10))
    equivalent = ["domain.b.x_f__mutmut_10"]
    code, _ = _run(tmp_path, equivalent, capsys)
    assert code == 0
    _meta(tmp_path, "domain/a.py", _mutants("domain.a", 10))
    _meta(tmp_path, "domain/b.py", _mutants("domain.b", 9, survived=1))
    _meta(tmp_path, "domain/c.py", _mutants("domain.c", 9, survived=1))
    code, out = _run(tmp_path, [], capsys)
    assert code == 1
    assert "domain/ in total is below 95%" in out


def test_an_equivalent_that_was_killed_is_reported_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _meta(tmp_path, "domain/money.py", _mutants("domain.money", 10))
    _meta(tmp_path, "adapters/charging/pusher.py", _mutants("adapters.charging.pusher", 10))
    code, out = _run(tmp_path, ["domain.money.x_f__mutmut_3"], capsys)
    assert code == 0
    assert "killed or gone (update the list):\n  domain.money.x_f__mutmut_3" in out


def test_no_results_asks_for_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(tmp_path, [], capsys)
    assert code == 2
    assert "run `make mutate`" in out
