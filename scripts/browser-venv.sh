#!/usr/bin/env bash
# Installs Selenium into its project venv when missing or stale, and prints the venv's
# python: what the console's browser test (cli/tests/console_browser.rs) runs
# scripts/console-browser.py with.
#
#   SAS_BROWSER_PYTHON="$(scripts/browser-venv.sh)"
#
# The venv installs scripts/requirements-browser.txt (Selenium and its closure pinned by
# version and sha256 hash; the top-level pin in requirements-browser.in, regenerate the
# .txt with pip-compile as its header says), only when that lock file changed (the venv
# keeps a copy of the one it was built from): --require-hashes --no-deps, wheels only,
# then `pip check`. The browser itself is Debian's (scripts/browser-deps.sh).
#
# Environment:
#   SAS_TOOLS_VENV   venv root (default <repo>/.venv-tools; the venv is its browser/)
#   PYTHON           interpreter for the venv (default python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="${SAS_TOOLS_VENV:-$ROOT/.venv-tools}/browser"
REQS="$ROOT/scripts/requirements-browser.txt"

stamp="$VENV/.sas-reqs"
if [[ ! -x "$VENV/bin/python" || ! -f "$stamp" ]] || ! cmp -s "$REQS" "$stamp"; then
    printf '==> installing into %s: %s\n' "${VENV#"$ROOT"/}" "${REQS#"$ROOT"/}" >&2
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: -r "$REQS" >&2
    out=$("$VENV/bin/pip" check --disable-pip-version-check 2>&1) || { printf '%s\n' "$out" >&2; exit 2; }
    cp "$REQS" "$stamp"
fi
printf '%s\n' "$VENV/bin/python"
