#!/usr/bin/env bash
# Makes sure Debian's chromium is present for the console's browser tests (Playwright drives it
# through executable_path; browser downloads by `playwright install` are not used).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "installing Chromium (Debian package chromium)..."
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
