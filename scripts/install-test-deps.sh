#!/usr/bin/env bash
# System packages the test suite needs: PostgreSQL, redis-server and Debian's Chromium (for Playwright).
set -euo pipefail
need=()
command -v pg_ctlcluster >/dev/null || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v chromium >/dev/null || need+=(chromium)
if ((${#need[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
