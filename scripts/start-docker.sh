#!/usr/bin/env bash
# Install Debian's Docker engine, docker-compose (1.29) and debootstrap when missing, and start the engine
# unless one answers; for `make test-compose`. Safe to call any number of times.
set -euo pipefail
say() { echo "start-docker: $*" >&2; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
  say "installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! $sudo docker info >/dev/null 2>&1; then
  log=/var/log/cairn-dockerd.log
  say "starting dockerd (log: $log)"
  $sudo sh -c "nohup dockerd >$log 2>&1 &"
  for _ in $(seq 60); do
    $sudo docker info >/dev/null 2>&1 && exit 0
    sleep 1
  done
  say "dockerd did not start; the end of $log:"
  $sudo tail -n 30 "$log" >&2
  exit 1
fi
