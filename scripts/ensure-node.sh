#!/usr/bin/env bash
# Makes sure Node.js 20 or newer and npm are present for the TypeScript SDK's tests
# (Debian's nodejs and npm packages).
set -euo pipefail
if command -v node >/dev/null && command -v npm >/dev/null \
  && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]; then
  exit 0
fi
echo "installing Node.js (Debian packages nodejs, npm)..."
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  echo "the TypeScript SDK needs Node.js 20 or newer; this system's package has $(node --version)" >&2
  exit 1
fi
