"""The compose stack's security (issue 13), read from infra/compose.yaml (no Docker
here): no superuser worker, no published database port, secrets from files, Grafana
without anonymous access, Kafka with SASL and ACLs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

INFRA = Path(__file__).resolve().parents[2] / "infra"
WORKERS = ("ingest", "relay", "project", "charge", "reconcile", "alerts")


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((INFRA / "compose.yaml").read_text())
    return loaded


def _env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def test_no_worker_logs_in_as_a_superuser_and_migrate_as_the_owner() -> None:
    services = _compose()["services"]
    for name in WORKERS:
        url = _env(services[name])["BILLING_LEDGER_DATABASE_URL"]
        assert url.startswith("postgresql://billing_writer@"), name
        assert ":" not in url.split("//")[1].split("@")[0], "no password in a URL"
    assert _env(services["migrate"])["BILLING_LEDGER_DATABASE_URL"].startswith(
        "postgresql://billing_owner@"
    )
    assert _env(services["anchor"])["BILLING_LEDGER_DATABASE_URL"].startswith(
        "postgresql://billing_auditor@"
    )
    init = (INFRA / "postgres-init.sh").read_text()
    assert "NOSUPERUSER" in init and "OWNER billing_owner" in init


def test_the_database_publishes_no_port_and_nothing_listens_on_every_address() -> None:
    services = _compose()["services"]
    assert "ports" not in services["postgres"]
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_secrets_come_from_files_not_the_environment() -> None:
    compose = _compose()
    assert all("file" in s for s in compose["secrets"].values())
    for name, service in compose["services"].items():
        for key, value in _env(service).items():
            assert "PASSWORD=" not in key + "=" or key.endswith("_FILE"), (name, key)
            assert not key.endswith(("_API_KEY", "_TOKEN", "_ANCHOR_KEY")), (name, key)
            assert "billing:billing" not in value
    assert _env(compose["services"]["ingest"])["BILLING_LEDGER_SECRETS_DIR"] == "/run/secrets"


def test_grafana_has_no_anonymous_access() -> None:
    grafana = _env(_compose()["services"]["grafana"])
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in grafana
    assert grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"].startswith("/run/secrets/")


def test_kafka_takes_sasl_only_with_acls_and_only_the_relay_writes_billing_events() -> None:
    services = _compose()["services"]
    kafka = _env(services["kafka"])
    assert "PLAINTEXT://" not in kafka["KAFKA_LISTENERS"].replace("SASL_PLAINTEXT://", "")
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert "Authorizer" in kafka["KAFKA_AUTHORIZER_CLASS_NAME"]
    for name in WORKERS:
        env = _env(services[name])
        assert env["BILLING_LEDGER_KAFKA_SECURITY_PROTOCOL"].startswith("SASL")
    assert _env(services["relay"])["BILLING_LEDGER_KAFKA_SASL_USERNAME"] == "billing-relay"
    writes = [
        line
        for line in (INFRA / "kafka-acls.sh").read_text().splitlines()
        if line.startswith("acl ") and "--operation Write" in line
    ]
    events = [w for w in writes if w.endswith(("--topic billing.events", "--topic billing.alerts"))]
    usage = [w for w in writes if w.endswith("--topic usage")]
    assert events == [w for w in writes if "User:billing-relay" in w]
    assert len(events) == 2
    assert len(usage) == 1 and "User:billing-producer" in usage[0]


def test_the_webhook_listener_runs_alone_with_its_secret_from_a_file_on_loopback() -> None:
    compose = _compose()
    webhooks = compose["services"]["webhooks"]
    assert webhooks["command"] == ["run", "--role", "webhooks"]
    assert "billing_ledger_webhook_secrets" in webhooks["secrets"]
    assert "file" in compose["secrets"]["billing_ledger_webhook_secrets"]
    assert webhooks["ports"] == ["127.0.0.1:9465:9465"]
    env = _env(webhooks)
    assert env["BILLING_LEDGER_DATABASE_URL"].startswith("postgresql://billing_writer@")
    assert "BILLING_LEDGER_WEBHOOK_SECRETS" not in env


def test_the_usage_topic_has_a_partition_for_every_ingest_process_of_six_containers() -> None:
    compose = _compose()
    ingest = compose["services"]["ingest"]
    command = ingest["command"]
    processes = int(command[command.index("--ingest-processes") + 1])
    partitions = int(_env(ingest)["BILLING_LEDGER_USAGE_PARTITIONS"])
    assert processes >= 2  # one per core of the container
    assert partitions % processes == 0 and partitions >= 6 * processes
    kafka = _env(compose["services"]["kafka"])
    assert int(kafka["KAFKA_NUM_PARTITIONS"]) == partitions
