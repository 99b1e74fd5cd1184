#!/usr/bin/env bash
# Start the local PostgreSQL cluster if needed, make a cairn role and a cairn_test database,
# and print the database URL for TEST_DATABASE_URL. CAIRN_TEST_DB names another database (one per checkout).
set -euo pipefail
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }

version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
pg_lsclusters -h | awk '{print $1, $2}' | grep -q "^$version main$" || as_root pg_createcluster "$version" main >/dev/null
pg_lsclusters -h | grep -Eq "^$version +main .*online" || as_root pg_ctlcluster "$version" main start >&2
port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}')
sql() { as_postgres psql -p "$port" -qtAX -c "$1"; }
[ "$(sql "SELECT 1 FROM pg_roles WHERE rolname = 'cairn'")" = 1 ] || sql "CREATE ROLE cairn LOGIN SUPERUSER PASSWORD 'cairn'" >/dev/null
db=${CAIRN_TEST_DB:-cairn_test}
[ "$(sql "SELECT 1 FROM pg_database WHERE datname = '$db'")" = 1 ] || sql "CREATE DATABASE $db OWNER cairn" >/dev/null
echo "postgresql+psycopg://cairn:cairn@127.0.0.1:$port/$db"
