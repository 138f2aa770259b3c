#!/bin/sh
# Run once by the postgres image's entrypoint (as its superuser, on first start only):
# the schema owner, which is no superuser, and its database. Nothing else ever logs in
# as the superuser; `migrate` (as billing_owner) makes the billing roles.
set -eu
owner_password=$(cat /run/secrets/billing_ledger_migrate_database_password)
psql -v ON_ERROR_STOP=1 --username postgres --dbname postgres \
  -v pw="$owner_password" <<'SQL'
CREATE ROLE billing_owner LOGIN CREATEROLE NOSUPERUSER NOCREATEDB PASSWORD :'pw';
CREATE DATABASE billing OWNER billing_owner;
REVOKE ALL ON DATABASE billing FROM PUBLIC;
GRANT CONNECT ON DATABASE billing TO billing_owner;
SQL
