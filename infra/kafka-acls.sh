#!/bin/sh
# Once, as the Kafka admin: SCRAM users, then ACLs (no ACL: no access). Only the relay
# produces to billing.events and billing.alerts; only producers (and the workers' dead
# letters) to usage.
set -eu
k=/opt/kafka/bin
cfg=/run/secrets/kafka_admin_client
b=kafka:9092
for user in billing-worker billing-relay billing-producer; do
  pw=$(cat "/run/secrets/kafka_${user#billing-}_password" 2>/dev/null || true)
  [ -n "$pw" ] && $k/kafka-configs.sh --bootstrap-server $b --command-config $cfg --alter \
    --add-config "SCRAM-SHA-512=[password=$pw]" --entity-type users --entity-name "$user"
done
acl() { $k/kafka-acls.sh --bootstrap-server $b --command-config $cfg --add "$@"; }
acl --allow-principal User:billing-producer --operation Write --operation Describe --topic usage
acl --allow-principal User:billing-worker --operation Read --operation Describe --topic usage
acl --allow-principal User:billing-worker --operation Write --operation Describe --topic usage.dlq
acl --allow-principal User:billing-worker --operation Read --operation Describe --topic billing.events
acl --allow-principal User:billing-worker --operation Read --group billing-ledger-ingest
acl --allow-principal User:billing-worker --operation Read --group billing-ledger-charge
acl --allow-principal User:billing-worker --operation Read --operation Describe --topic billing.alerts
acl --allow-principal User:billing-worker --operation Read --group billing-ledger-alert-webhooks
acl --allow-principal User:billing-relay --operation Write --operation Describe --topic billing.events
acl --allow-principal User:billing-relay --operation Write --operation Describe --topic billing.alerts
