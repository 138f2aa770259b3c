#!/bin/sh
# Makes infra/secrets/ for infra/compose.yaml: random passwords, token and anchor key
# (files of mode 0600; keep them out of version control). Set the Stripe key by hand.
set -eu
d=$(dirname "$0")/secrets
mkdir -p "$d" && chmod 700 "$d"
umask 077
rand() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
for f in postgres_superuser_password billing_owner_password billing_writer_password \
         billing_reader_password billing_auditor_password kafka_worker_password \
         kafka_relay_password kafka_producer_password kafka_admin_password http_token \
         anchor_key grafana_admin_password; do
  [ -f "$d/$f" ] || rand > "$d/$f"
done
[ -f "$d/stripe_api_key" ] || printf 'sk_test_billing_ledger' > "$d/stripe_api_key"
# Stripe's endpoint signing secret (whsec_...), from the dashboard; comma-separate two
# during a rotation.
[ -f "$d/webhook_secrets" ] || printf 'whsec_%s' "$(rand)" > "$d/webhook_secrets"
admin=$(cat "$d/kafka_admin_password")
cat > "$d/kafka_server_jaas.conf" <<JAAS
KafkaServer {
  org.apache.kafka.common.security.scram.ScramLoginModule required
  username="admin" password="$admin";
};
JAAS
cat > "$d/kafka_admin_client.properties" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin";
PROPS
echo "secrets written to $d"
