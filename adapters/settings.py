"""Settings, from environment variables prefixed ``BILLING_LEDGER_`` (pydantic-settings)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

from adapters.alerts.policy import DeliveryPolicy
from domain.errors import PriceListError
from domain.periods import PeriodPolicy
from domain.pricing import PriceList
from domain.saga import RetryPolicy
from domain.usage import DEFAULT_MAX_AGE, DEFAULT_MAX_AHEAD, DEFAULT_MAX_RECORD_BYTES, UsageWindow
from domain.verification import LandingWindow
from store.schema import (
    DEFAULT_ALERTS_TOPIC,
    DEFAULT_DLQ_TOPIC,
    DEFAULT_EVENTS_TOPIC,
    DEFAULT_USAGE_TOPIC,
)

__all__ = ["DEFAULT_PRICE_LIST", "SECRETS_DIR_ENV", "Settings", "StripeSettings", "child_env"]

DEFAULT_PRICE_LIST = Path(__file__).resolve().parent.parent / "infra" / "prices.example.toml"
# A directory of files named after settings (``billing_ledger_database_password``, ...):
# Docker secrets (``/run/secrets``). Read when Settings() is made, never at import.
SECRETS_DIR_ENV = "BILLING_LEDGER_SECRETS_DIR"


@dataclass(frozen=True)
class StripeSettings:
    api_key: str = field(default="sk_test_billing_ledger", repr=False)
    api_base: str = "https://api.stripe.com"
    rate_per_s: int = 25
    max_concurrency: int = 8
    breaker_fail_max: int = 5
    breaker_reset_s: float = 5.0
    timeout_s: float = 10.0
    # Stripe keeps idempotency keys for at least 24 hours; past this age, look first.
    key_window: timedelta = timedelta(hours=23)


class Settings(BaseSettings):
    """Where the services are and how the workers behave.

    Secrets (the database and role passwords, the Stripe key, the webhook secrets, the
    HTTP token, the anchor key, the Kafka password) are ``SecretStr``: ``repr`` shows
    ``**********``. The URLs are left out of ``repr`` (one may hold a password). Each
    can also be a file in ``$BILLING_LEDGER_SECRETS_DIR`` named after it in lower case
    (``billing_ledger_database_password``): how Docker secrets arrive.
    """

    model_config = SettingsConfigDict(env_prefix="BILLING_LEDGER_", extra="ignore")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        secrets_dir = os.environ.get(SECRETS_DIR_ENV)
        if not secrets_dir:
            return init_settings, env_settings, dotenv_settings
        files = SecretsSettingsSource(settings_cls, secrets_dir=secrets_dir)
        return init_settings, env_settings, dotenv_settings, files

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/postgres",
        description="libpq URI of this process's login (workers: billing_writer)",
        repr=False,
    )
    database_password: SecretStr = Field(
        SecretStr(""), description="its password, when not in the URL (e.g. a Docker secret)"
    )
    migrate_database_url: str | None = Field(
        None,
        description="the schema owner's login, for migrate and rebuild (default: DATABASE_URL)",
        repr=False,
    )
    migrate_database_password: SecretStr = Field(SecretStr(""), description="its password")
    writer_password: SecretStr = Field(
        SecretStr(""), description="migrate sets billing_writer's password to this (empty: kept)"
    )
    reader_password: SecretStr = Field(
        SecretStr(""), description="migrate sets billing_reader's password to this (empty: kept)"
    )
    auditor_password: SecretStr = Field(
        SecretStr(""), description="migrate sets billing_auditor's password to this (empty: kept)"
    )
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT", description="how clients talk to the brokers (SASL_SSL in production)"
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="the SASL mechanism, when the protocol is SASL_*"
    )
    kafka_sasl_username: str = Field("", description="this process's Kafka principal")
    kafka_sasl_password: SecretStr = Field(SecretStr(""), description="its password")
    usage_topic: str = Field(
        DEFAULT_USAGE_TOPIC, description="the usage records' topic (created if missing)"
    )
    dlq_topic: str = Field(
        DEFAULT_DLQ_TOPIC, description="where dead letters go, with their reason in headers"
    )
    usage_partitions: int = Field(4, ge=1, description="partitions when creating the topic")
    ingest_group: str = Field(
        "billing-ledger-ingest", description="consumer group of the ingest processes"
    )
    price_list: Path = Field(
        DEFAULT_PRICE_LIST,
        description="the price file `migrate` starts the price book with (version 1, in force"
        " from the epoch) when the ledger has none; later prices: `billing-ledger prices publish`",
    )
    max_record_bytes: int = Field(
        DEFAULT_MAX_RECORD_BYTES, ge=256, description="larger usage records are dead letters"
    )
    usage_max_age_days: int = Field(
        DEFAULT_MAX_AGE.days,
        ge=1,
        le=36_500,
        description="usage that occurred longer ago is a dead letter (`occurred_at too old`)",
    )
    usage_max_ahead_s: int = Field(
        int(DEFAULT_MAX_AHEAD.total_seconds()),
        ge=0,
        le=31 * 86_400,
        description="usage dated further ahead of the ledger's clock is a dead letter"
        " (`occurred_at too far ahead`)",
    )
    dlq_max_message_bytes: int = Field(
        1_000_000,
        ge=4096,
        description="larger dead letters go to the DLQ topic as a 4 KiB prefix (its limit)",
    )
    dead_letter_retention_days: int = Field(
        30, ge=0, description="dead letters older than this are removed (0: kept forever)"
    )
    batch_max_records: int = Field(2000, ge=1, description="records per database save")
    ingest_processes: int | None = Field(
        None, ge=1, description="ingest processes `run` starts (default: the cores it may use)"
    )
    ingest_overlap_saves: bool = Field(
        True, description="save a batch on a writer thread while the next is decided"
    )
    poll_timeout_ms: int = Field(200, ge=1, description="how long a Kafka poll waits for records")
    fetch_max_wait_ms: int = Field(
        10, ge=1, description="longest a fetch waits for data (latency of each Kafka hop)"
    )
    db_pool_size: int = Field(4, ge=1, description="database connections per process")

    # -- schema (store.migrations) -------------------------------------------------------
    schema_wait_s: float = Field(
        600.0, gt=0, description="a starting worker waits this long for migrate, then exits"
    )
    schema_check_interval_s: float = Field(
        5.0, gt=0, description="how often a waiting worker looks at the schema version again"
    )
    migrate_lock_timeout_s: float = Field(
        5.0, gt=0, description="a migration's statement gives up waiting for a lock after this"
    )
    migrate_attempts: int = Field(
        10, ge=1, description="tries of a migration whose locks were not free (with backoff)"
    )

    # -- charging ---------------------------------------------------------------
    events_topic: str = Field(
        DEFAULT_EVENTS_TOPIC, description="the topic the relay publishes events to"
    )
    events_partitions: int = Field(4, ge=1, description="partitions when creating the events topic")
    charge_group: str = Field(
        "billing-ledger-charge", description="consumer group of the charge process managers"
    )
    stripe_api_base: str = Field(
        "http://127.0.0.1:12111", description="Stripe's API (default: the local emulator)"
    )
    stripe_api_key: SecretStr = Field(
        SecretStr("sk_test_billing_ledger"), description="Stripe's secret key"
    )
    stripe_rate_per_s: int = Field(25, ge=1, description="Stripe requests per second, at most")
    stripe_max_concurrency: int = Field(
        8, ge=1, description="Stripe requests in flight at most (AIMD adapts below it)"
    )
    stripe_timeout_s: float = Field(10.0, gt=0, description="a Stripe request's timeout")
    line_takeover_s: float = Field(
        60.0,
        gt=0,
        description="a line whose owner (the process holding its customer's partition of"
        " billing.events) has not pushed its change for this long is pushed by any reconciler",
    )
    draft_check_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="share of STRIPE_RATE_PER_S spent reading open drafts back between"
        " closes (one read each); 0: drafts are read back only when they close",
    )
    stripe_landing_margin_s: float = Field(
        30.0,
        ge=0,
        description="how long after its client gave up a request may still take effect in"
        " Stripe: the closer reads a draft back only when no request can still land",
    )
    stripe_key_window_s: float = Field(
        23 * 3600.0, gt=0, description="past this age, look a charge up before creating it"
    )
    breaker_fail_max: int = Field(5, ge=1, description="failures in a row that open the breaker")
    breaker_reset_s: float = Field(
        5.0, gt=0, description="an open breaker lets a probe through after this"
    )
    retry_horizon_s: float = Field(
        3600.0,
        gt=0,
        description="a line failing longer is reported failing (retries go on: owed usage is"
        " never dropped)",
    )
    retry_base_s: float = Field(1.0, gt=0, description="first retry delay (full-jitter backoff)")
    retry_max_delay_s: float = Field(300.0, gt=0, description="longest retry delay")
    stale_after_s: float = Field(30.0, gt=0, description="reconciler drives Reserved after")
    reconcile_interval_s: float = Field(
        5.0, gt=0, description="how often the reconciler looks for work past its due time"
    )
    billing_period: str = Field(
        "month", description="invoice periods: month, day, hour, or a number of seconds (UTC)"
    )
    settle_interval_s: float = Field(
        30.0,
        gt=0,
        description="a line is pushed to Stripe at most this often (its first change at"
        " once); 30 s: bench charge at 2,000 records/s over 300 lines sent 4.8 Stripe"
        " requests per 1,000 records with a usage-to-charged p99 of 33-34 s, against 8.6"
        " and 16 s at 10 s",
    )
    settle_quiet_s: float = Field(
        2.0,
        ge=0,
        description="a line quiet (no change for four of its usual gaps between changes,"
        " and at least this long) is pushed before its interval ends (0: never; a line that"
        " keeps changing is pushed once an interval either way); 2 s: bench outage drained"
        " 35.4 s after recovery instead of 46.9 s at 0, with no more Stripe requests at 100"
        " or 1,000 records/s",
    )
    settle_quiet_min_s: float = Field(
        5.0,
        gt=0,
        description="with SETTLE_QUIET_S, the least time between two pushes of a line",
    )
    invoice_grace_s: float = Field(
        3600.0, ge=0, description="an invoice closes this long after its period ends"
    )

    # -- webhooks (POST /webhooks/stripe, on a listener of its own) ----------------------
    webhook_host: str = Field("127.0.0.1", description="address the webhook listener binds")
    webhook_port: int = Field(9465, ge=0, le=65535, description="its port (0: any free one)")
    webhook_secrets: SecretStr = Field(
        SecretStr(""),
        description="Stripe's endpoint signing secrets (whsec_...), comma-separated during a"
        " rotation; empty: no listener",
    )
    webhook_tolerance_s: int = Field(300, ge=1, description="oldest signature accepted")
    webhook_max_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="larger bodies are answered 413"
    )
    webhook_max_concurrency: int = Field(
        32, ge=1, description="requests handled at once (more are answered 503)"
    )
    webhook_timeout_s: float = Field(
        10.0, gt=0, description="a request's headers and body must arrive within this"
    )
    webhook_group_max: int = Field(
        200, ge=1, le=1000, description="webhooks applied in one transaction at most (1: alone)"
    )

    def webhook_secret_list(self) -> list[str]:
        return [s.strip() for s in self.webhook_secrets.get_secret_value().split(",") if s.strip()]

    # -- spend alerts and their webhooks (adapters.alerts) ------------------------------
    alerts_topic: str = Field(
        DEFAULT_ALERTS_TOPIC,
        description="the topic the relay publishes spend alert crossings to (JSON documents)",
    )
    alert_webhook_group: str = Field(
        "billing-ledger-alert-webhooks",
        description="consumer group of the alert webhooks role (reads the alerts topic)",
    )
    alert_webhook_timeout_s: float = Field(
        10.0,
        gt=0,
        le=60,
        description="one webhook request, connecting to answer, at most (then a timeout)",
    )
    alert_webhook_concurrency: int = Field(
        4, ge=1, le=64, description="requests in flight to one endpoint at most"
    )
    alert_webhook_retry_base_s: float = Field(
        10.0, gt=0, description="first retry delay of a failed webhook (jittered, doubling)"
    )
    alert_webhook_retry_max_delay_s: float = Field(
        3600.0, gt=0, description="longest delay between two webhook attempts"
    )
    alert_webhook_retry_horizon_s: float = Field(
        3 * 86400.0, gt=0, description="a webhook is retried this long, then failed (3 days)"
    )
    alert_webhook_allow_private: bool = Field(
        False,
        description="allow webhook URLs resolving to loopback, private or link-local addresses"
        " (refused by default: a receiver on this host or network only; never in production"
        " with URLs others can register)",
    )

    def alert_delivery_policy(self) -> DeliveryPolicy:
        return DeliveryPolicy(
            timeout_s=self.alert_webhook_timeout_s,
            concurrency=self.alert_webhook_concurrency,
            retry=RetryPolicy(
                horizon=timedelta(seconds=self.alert_webhook_retry_horizon_s),
                base_delay=timedelta(seconds=self.alert_webhook_retry_base_s),
                max_delay=timedelta(seconds=self.alert_webhook_retry_max_delay_s),
            ),
            allow_private=self.alert_webhook_allow_private,
        )

    # -- anchoring (billing-ledger anchor; audit verifies) ------------------------------
    anchor_path: Path | None = Field(
        None,
        description="the append-only file of signed checkpoints, outside the database"
        " (unset: nothing anchored, audit checks no checkpoint)",
    )
    anchor_key: SecretStr = Field(
        SecretStr(""),
        description="HMAC-SHA256 key of the checkpoints (32+ bytes); the anchor job's and"
        " the auditor's only, never the database's",
    )
    anchor_interval_s: float = Field(
        60.0, gt=0, description="anchor --every: seconds between checkpoints"
    )

    # -- supervision ------------------------------------------------------------------
    role_restart_base_s: float = Field(
        1.0, gt=0, description="first pause before a failed role restarts (then doubling)"
    )
    role_restart_max_delay_s: float = Field(30.0, gt=0, description="longest such pause")
    role_max_failures: int = Field(
        5, ge=1, description="failures of one role within the window that end the process"
    )
    role_failure_window_s: float = Field(60.0, gt=0, description="the window of those failures")

    # -- health ---------------------------------------------------------------------
    health_host: str = Field("127.0.0.1", description="address the health server listens on")
    health_port: int = Field(
        9464, ge=0, le=65535, description="port of /healthz /readyz /health /metrics (0: off)"
    )
    http_token: SecretStr = Field(
        SecretStr(""),
        description="bearer token of /balances and /transactions (empty: they answer 401)",
    )
    heartbeat_interval_s: float = Field(
        5.0, gt=0, description="how often workers record heartbeat, breaker state and lag"
    )
    health_max_consumer_lag: int = Field(10_000, ge=0, description="degraded above this lag")
    health_max_dead_letters_per_hour: int = Field(
        60, ge=0, description="degraded when more dead letters than this arrived in the last hour"
    )

    def heartbeat_timeout_s(self) -> float:
        """A worker whose last heartbeat is older than this is reported silent."""
        return 3 * self.heartbeat_interval_s

    # -- traces -----------------------------------------------------------------
    trace_exporter: Literal["none", "console", "otlp"] = Field(
        "none", description="where spans go: nowhere, stdout (JSON), or an OTLP/HTTP collector"
    )
    otlp_endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces", description="OTLP/HTTP traces endpoint"
    )
    service_name: str = Field("billing-ledger", description="service.name of the spans")

    def overdue_after(self) -> timedelta:
        """An unfinished transaction is overdue this long after it was metered: the retry
        horizon plus one reconciler interval (invariant I2)."""
        return timedelta(seconds=self.retry_horizon_s + self.reconcile_interval_s)

    @field_validator("billing_period")
    @classmethod
    def _period(cls, value: str) -> str:
        return str(PeriodPolicy.parse(value))

    def periods(self) -> PeriodPolicy:
        return PeriodPolicy.parse(self.billing_period)

    def usage_window(self) -> UsageWindow:
        """How far from the clock a record's ``occurred_at`` may be (domain.usage)."""
        return UsageWindow(
            max_age=timedelta(days=self.usage_max_age_days),
            max_ahead=timedelta(seconds=self.usage_max_ahead_s),
        )

    def ingest_process_count(self) -> int:
        """``ingest_processes``, or else the cores this process may run on."""
        if self.ingest_processes is not None:
            return self.ingest_processes
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            horizon=timedelta(seconds=self.retry_horizon_s),
            base_delay=timedelta(seconds=self.retry_base_s),
            max_delay=timedelta(seconds=self.retry_max_delay_s),
            stale_after=timedelta(seconds=self.stale_after_s),
        )

    def draft_checks_per_pass(self) -> int:
        """How many open drafts each close pass may read back: the share of the Stripe
        rate over one reconcile interval (at least 1 when the share is not 0)."""
        if self.draft_check_share == 0:
            return 0
        budget = self.draft_check_share * self.stripe_rate_per_s * self.reconcile_interval_s
        return max(1, int(budget))

    def landing_window(self) -> LandingWindow:
        """How long a request sent to Stripe may still take effect (domain.verification)."""
        return LandingWindow(
            per_call=timedelta(seconds=3 * self.stripe_timeout_s),
            margin=timedelta(seconds=self.stripe_landing_margin_s),
        )

    def stripe(self) -> StripeSettings:
        return StripeSettings(
            api_key=self.stripe_api_key.get_secret_value(),
            api_base=self.stripe_api_base,
            rate_per_s=self.stripe_rate_per_s,
            max_concurrency=self.stripe_max_concurrency,
            breaker_fail_max=self.breaker_fail_max,
            breaker_reset_s=self.breaker_reset_s,
            timeout_s=self.stripe_timeout_s,
            key_window=timedelta(seconds=self.stripe_key_window_s),
        )

    def load_prices(self) -> PriceList:
        """The price list named by ``price_list``; PriceListError naming the setting when
        it cannot be read or is not valid (once the ledger has a price book the file prices
        nothing, so it may well have been moved: the setting is what to mend)."""
        named = f"the configured price file (BILLING_LEDGER_PRICE_LIST={self.price_list})"
        try:
            text = self.price_list.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise PriceListError(f"{named} cannot be read ({reason})") from None
        try:
            return PriceList.from_toml(text)
        except PriceListError as exc:
            raise PriceListError(f"{named}: {exc}") from None


def child_env(settings: Settings) -> dict[str, str]:
    """The environment a ``billing-ledger`` child process needs to use ``settings``: this
    process's, without its ``BILLING_LEDGER_*`` variables, plus one for every setting
    that is set (an unset one, None, is left out: the child's default applies)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILLING_LEDGER_")}
    for key, value in settings.model_dump().items():
        if value is not None:
            shown = value.get_secret_value() if isinstance(value, SecretStr) else value
            env[f"BILLING_LEDGER_{key.upper()}"] = str(shown)
    return env
