"""``billing-ledger prices``: misuse and an invalid file are refused with the reason and
status 2 before anything is read from or written to the ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.cli.main import main


def test_a_price_file_that_cannot_be_read_is_misuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.toml"
    assert main(["prices", "publish", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"billing-ledger: error: cannot read the price file {missing}: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not toml [", "price list is not valid TOML: "),
        ("[other]\n", "price list has no [meters.NAME] tables"),
        ('[meters."m"]\nunit_price = "1"\n', "meter 'm': missing 'currency'"),
        ('[meters."m"]\nunit_price = "-1"\ncurrency = "USD"\n', "meter 'm': unit_price must be"),
    ],
)
def test_an_invalid_price_file_is_refused_with_its_reason_and_nothing_published(
    body: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "prices.toml"
    file.write_text(body)
    assert main(["prices", "publish", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"billing-ledger: error: {file}: {reason}")
    assert err.endswith("; nothing was published\n")


def test_show_takes_a_moment_or_a_version_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prices", "show", "--at", "2026-12-01", "--version", "1"]) == 2
    assert capsys.readouterr().err == "billing-ledger: error: give --at or --version, not both\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["prices", "publish", "p.toml", "--effective-from", "next tuesday"],
        ["prices", "show", "--version", "0"],
        ["prices"],
    ],
)
def test_bad_arguments_are_misuse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "(see --help)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (None, " cannot be read (No such file or directory)"),
        ('[meters."m"]\nunit_price = "1"\n', ": meter 'm': missing 'currency'"),
    ],
    ids=["missing", "invalid"],
)
def test_a_configured_price_file_gone_or_broken_is_a_setting_named_with_status_2(
    body: str | None,
    reason: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Once the book exists the configured file prices nothing, so an operator may well
    have moved it: every command that opens the ledger says which setting to mend."""
    configured = tmp_path / "configured.toml"
    if body is not None:
        configured.write_text(body)
    monkeypatch.setenv("BILLING_LEDGER_PRICE_LIST", str(configured))
    monkeypatch.setenv("BILLING_LEDGER_DATABASE_URL", "postgresql://127.0.0.1:1/none")
    assert main(["prices", "list"]) == 2
    assert capsys.readouterr().err == (
        f"billing-ledger: error: the configured price file (BILLING_LEDGER_PRICE_LIST="
        f"{configured}){reason}\n"
    )


def test_show_prints_tiers_packages_and_fees_readably() -> None:
    from adapters.cli.prices import price_rows
    from domain.pricing import PriceList
    from tests.unit.test_pricing_models import TIERED_TOML

    prices = PriceList.from_toml(TIERED_TOML)
    rows = [r for name, p in prices.prices.items() for r in price_rows(name, p)]
    assert [tuple(r.values()) for r in rows] == [
        ("tokens", "graduated", "", ""),
        ("  tier 1: 1 to 1,000,000", "", "2.50 USD", "1,000,000"),
        ("  tier 2: above 1,000,000", "", "2.00 USD", "1,000,000"),
        ("  flat fee", "", "10.00 USD", "period"),
        ("seats", "package", "40.00 EUR", "block of 5"),
        ("calls", "per_unit", "0.001 USD", "1"),
    ]
