#!/usr/bin/env bash
# Installs what the console's browser test (scripts/console-browser.py) needs:
# Debian's chromium and chromium-driver, when missing. Non-interactive; runs apt-get update
# first only if the install fails without it. Needs root (as CI runs), or sudo.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "browser-deps: chromium and chromium-driver are missing and this is not root (no sudo)" >&2
        exit 1
    fi
fi
install() {
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver
}
echo "browser-deps: installing chromium and chromium-driver (apt)" >&2
if ! install; then
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update
    install
fi
command -v chromium >/dev/null && command -v chromedriver >/dev/null
