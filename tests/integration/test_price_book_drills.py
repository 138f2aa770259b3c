"""The price book under a hostile operator: publications and migrations at once, the
reader login, moments the book cannot hold, garbage for ``--at``."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from adapters.bootstrap import _apply_migrations, migrate, open_ledger
from adapters.settings import Settings
from domain.price_book import EPOCH
from domain.pricing import PriceList
from store.roles import AUDITOR, READER
from tests.conftest import settings_env
from tests.integration.roles import as_role
from tests.integration.support import price_file

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "adapters.cli"]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _at_once(env: dict[str, str], commands: list[list[str]]) -> list[tuple[int, str, str]]:
    """Every command started before any is waited for: (status, stdout, stderr) each."""
    procs = [
        subprocess.Popen(
            [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for args in commands
    ]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        out.append((proc.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("started", [True, False], ids=["book-started", "no-book-yet"])
def test_publications_at_once_are_each_recorded_numbered_without_a_gap(
    settings: Settings, tmp_path: Path, started: bool
) -> None:
    """Four publications at once (and, on a ledger without a book, a migration with
    them): each is a version, 2 to 5, the configured file version 1."""
    env = settings_env(settings)
    prices = [f"0.00{n}" for n in range(2, 6)]
    commands = [["prices", "publish", str(price_file(tmp_path, p))] for p in prices]
    if started:
        migrate(settings)
    else:  # the schema only: the book is started by whichever command comes first
        _apply_migrations(settings, lambda m: None)
        commands.append(["migrate"])
    ran = _at_once(env, commands)
    assert [status for status, _, _ in ran] == [0] * len(commands), [e for _, _, e in ran]
    said = sorted(int(out.split()[4].rstrip(",")) for _, out, _ in ran[: len(prices)])
    assert said == [2, 3, 4, 5]
    with open_ledger(settings) as ledger:
        book = ledger.price_book()
    assert book is not None
    assert [v.number for v in book.versions] == [1, 2, 3, 4, 5]
    assert book.versions[0].prices == settings.load_prices()
    published = sorted(str(v.prices.price_of("api.requests").unit_price) for v in book.versions[1:])
    assert published == prices


def test_migrations_at_once_start_one_book(settings: Settings) -> None:
    env = settings_env(settings)
    ran = _at_once(env, [["migrate"], ["migrate"], ["migrate"]])
    assert [status for status, _, _ in ran] == [0, 0, 0], [e for _, _, e in ran]
    started = [out for _, out, _ in ran if "price book started: version 1 is " in out]
    assert len(started) == 1
    with open_ledger(settings) as ledger:
        book = ledger.price_book()
    assert book is not None and [v.number for v in book.versions] == [1]
    assert book.versions[0].prices == settings.load_prices()


def test_only_the_writer_publishes_the_others_are_told_which_login_to_use(
    roles_settings: Settings, server: str, tmp_path: Path
) -> None:
    migrate(roles_settings)
    env = settings_env(roles_settings)  # the workers' login: billing_writer
    done = _cli(env, "prices", "publish", str(price_file(tmp_path, "0.002")))
    assert done.returncode == 0, done.stderr
    for role in (READER, AUDITOR):
        env["BILLING_LEDGER_DATABASE_URL"] = as_role(server, role)
        refused = _cli(env, "prices", "publish", str(price_file(tmp_path, "0.003")))
        assert refused.returncode == 2, (role, refused.stderr)
        assert "this login may not do that (permission denied" in refused.stderr
        assert "prices publish write as billing_writer" in refused.stderr
    shown = _cli(env | {"BILLING_LEDGER_DATABASE_URL": as_role(server, READER)}, "prices", "list")
    assert shown.returncode == 2, shown.stderr
    assert "this login may not do that (permission denied" in shown.stderr
    with open_ledger(roles_settings) as ledger:
        book = ledger.price_book()
    assert book is not None and [v.number for v in book.versions] == [1, 2]


def test_the_auditor_reads_the_book_as_the_docs_say(roles_settings: Settings, server: str) -> None:
    migrate(roles_settings)
    env = settings_env(roles_settings)
    env["BILLING_LEDGER_DATABASE_URL"] = as_role(server, AUDITOR)
    listed = _cli(env, "prices", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [v["version"] for v in json.loads(listed.stdout)["versions"]] == [1]
    shown = _cli(env, "prices", "show", "--at", "2027-01-01T00:00:00Z")
    assert shown.returncode == 0, shown.stderr


@pytest.mark.parametrize(
    "moment",
    ["9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+01:00"],
)
def test_a_moment_beyond_what_a_timestamp_holds_in_utc_is_misuse(
    settings: Settings, tmp_path: Path, moment: str
) -> None:
    migrate(settings)
    env = settings_env(settings)
    refused = _cli(
        env, "prices", "publish", str(price_file(tmp_path, "0.002")), "--effective-from", moment
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("billing-ledger: error: ")
    assert "Traceback" not in refused.stderr
    listed = json.loads(_cli(env, "prices", "list", "--json").stdout)
    assert [v["version"] for v in listed["versions"]] == [1]


def test_the_far_future_before_the_epoch_and_odd_zones_are_moments_like_any(
    settings: Settings, tmp_path: Path
) -> None:
    migrate(settings)
    env = settings_env(settings)
    for moment, price in (
        ("9999-12-31T23:59:59.999999Z", "0.002"),
        ("1969-07-20T20:17:40", "0.003"),  # no offset: UTC
        ("2027-01-01T05:45:00+05:45", "0.004"),  # Kathmandu
    ):
        done = _cli(
            env, "prices", "publish", str(price_file(tmp_path, price)), "--effective-from", moment
        )
        assert done.returncode == 0, done.stderr
    listed = json.loads(_cli(env, "prices", "list", "--json").stdout)["versions"]
    assert [v["effective_from"] for v in listed] == [
        "1970-01-01T00:00:00+00:00",
        "9999-12-31T23:59:59.999999+00:00",
        "1969-07-20T20:17:40+00:00",
        "2027-01-01T00:00:00+00:00",
    ]

    def version_at(moment: str) -> int:
        shown = _cli(env, "prices", "show", "--at", moment, "--json")
        assert shown.returncode == 0, shown.stderr
        number: int = json.loads(shown.stdout)["version"]
        return number

    assert version_at("9999-12-31T23:59:59.999999Z") == 2
    assert version_at("9999-12-31T23:59:59.999998Z") == 4
    assert version_at("2026-12-31T19:00:00-05:00") == 4  # the same instant, in New York
    assert version_at("2026-12-31T18:59:59.999999-05:00") == 1
    assert version_at("1970-01-01T00:00:00Z") == 1
    assert version_at("1969-12-31T23:59:59Z") == 3
    assert version_at("0001-01-01T00:00:00Z") == 3  # before every version: the earliest


@pytest.mark.parametrize("garbage", ["yesterday", "", "2027-13-01", "2027-01-01T25:00Z", "1e9"])
def test_show_at_garbage_is_misuse(settings: Settings, garbage: str) -> None:
    migrate(settings)
    shown = _cli(settings_env(settings), "prices", "show", "--at", garbage)
    assert shown.returncode == 2, shown.stderr
    assert "is not an ISO 8601 timestamp" in shown.stderr


@pytest.mark.parametrize(
    "cache",
    [
        {"AGGREGATE_CACHE_FASTFORWARD": "n"},
        {"AGGREGATE_CACHE_MAXSIZE": ""},
        {"AGGREGATE_CACHE_FASTFORWARD_SKIPPING": "y"},
    ],
    ids=["no-fast-forward", "no-cache", "skipping"],
)
def test_a_worker_sees_each_published_version_whatever_the_aggregate_cache_does(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: dict[str, str]
) -> None:
    migrate(settings)
    for name, value in cache.items():
        monkeypatch.setenv(name, value)
    with open_ledger(settings) as worker, open_ledger(settings) as publisher:
        assert [v.number for v in worker.refresh_prices().versions] == [1]
        for n, price in enumerate(("0.002", "0.003"), start=2):
            prices = PriceList.from_toml(price_file(tmp_path, price).read_text())
            publisher.publish_prices(prices, EPOCH + timedelta(days=n))
            schedule = worker.refresh_prices()
            assert [v.number for v in schedule.versions] == list(range(1, n + 1))
            assert schedule.latest.prices == prices
        assert worker.refresh_prices() is schedule  # nothing new: the same schedule
