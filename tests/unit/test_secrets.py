"""Secrets stay secret (issue 13): settings print no key, password or URL; a database
URL that libpq cannot parse is never echoed with its password, in an error or in the
health report; secrets can arrive as files (Docker secrets)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from adapters.observability.health_server import HealthProbe
from adapters.settings import SECRETS_DIR_ENV, Settings
from store.connections import Database, redact, scrub

BAD_URL = "postgresql://billing_writer:s3cret-pw@[db.internal/billing"


def test_repr_of_settings_shows_no_secret() -> None:
    settings = Settings(
        database_url="postgresql://u:url-pw@h/db",
        stripe_api_key="sk_live_abc",  # type: ignore[arg-type]
        webhook_secrets="whsec_1",  # type: ignore[arg-type]
        anchor_key="k" * 32,  # type: ignore[arg-type]
        kafka_sasl_password="kafka-pw",  # type: ignore[arg-type]
    )
    shown = repr(settings) + str(settings) + repr(settings.stripe())
    for secret in ("url-pw", "sk_live_abc", "whsec_1", "k" * 32, "kafka-pw"):
        assert secret not in shown
    assert settings.stripe().api_key == "sk_live_abc"


def test_an_unparsable_database_url_is_never_echoed_with_its_password() -> None:
    with pytest.raises(psycopg.Error) as raised:
        Database(BAD_URL).dedicated()
    assert "s3cret-pw" not in str(raised.value)
    assert "s3cret-pw" not in repr(Database(BAD_URL))
    assert "s3cret-pw" not in scrub(f"failed: {BAD_URL}", BAD_URL)
    assert redact("postgresql://u:pw@h/db") == "user=u password=*** dbname=db host=h"


def test_the_health_report_of_an_unparsable_url_names_no_password() -> None:
    report = HealthProbe(Settings(database_url=BAD_URL)).report()
    assert report["status"] == "failing"
    assert "s3cret-pw" not in str(report)


def test_secrets_can_be_files_in_the_secrets_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "billing_ledger_database_password").write_text("from-a-file")
    (tmp_path / "billing_ledger_stripe_api_key").write_text("sk_file")
    monkeypatch.setenv(SECRETS_DIR_ENV, str(tmp_path))
    settings = Settings()
    assert settings.database_password.get_secret_value() == "from-a-file"
    assert settings.stripe_api_key.get_secret_value() == "sk_file"
