"""Settings, from environment variables prefixed ``BILLING_LEDGER_`` (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from domain.pricing import PriceList
from domain.usage import DEFAULT_MAX_RECORD_BYTES

__all__ = ["DEFAULT_PRICE_LIST", "Settings"]

DEFAULT_PRICE_LIST = Path(__file__).resolve().parent.parent / "infra" / "prices.example.toml"


class Settings(BaseSettings):
    """Where the services are and how the workers behave."""

    model_config = SettingsConfigDict(env_prefix="BILLING_LEDGER_", extra="ignore")

    database_url: str = Field(
        "postgresql://postgres@127.0.0.1:5432/postgres",
        description="libpq URI of the PostgreSQL database that holds the event store",
    )
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers")
    usage_topic: str = "usage"
    dlq_topic: str = "usage.dlq"
    usage_partitions: int = Field(4, ge=1, description="partitions when creating the topic")
    ingest_group: str = "billing-ledger-ingest"
    price_list: Path = DEFAULT_PRICE_LIST
    max_record_bytes: int = Field(DEFAULT_MAX_RECORD_BYTES, ge=256)
    batch_max_records: int = Field(2000, ge=1, description="records per database save")
    poll_timeout_ms: int = Field(200, ge=1)
    db_pool_size: int = Field(4, ge=1)

    def load_prices(self) -> PriceList:
        """The price list named by ``price_list`` (raises PriceListError / OSError)."""
        return PriceList.from_toml(self.price_list.read_text(encoding="utf-8"))
