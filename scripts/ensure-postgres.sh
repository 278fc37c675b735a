#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries (initdb, pg_ctl) are present for the test suite.
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exit 0
fi
echo "installing PostgreSQL server binaries (Debian package postgresql)..."
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
