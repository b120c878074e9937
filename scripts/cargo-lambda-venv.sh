#!/usr/bin/env bash
# Installs cargo-lambda into its project venv when missing or stale, and prints the venv's
# bin directory (cargo-lambda, and the zig it ships, are there):
#
#   PATH="$(scripts/cargo-lambda-venv.sh):$PATH"
#
# One install path for every user of cargo-lambda: scripts/package.sh (arm64 builds), the
# test command's `cargo lambda watch` end-to-end test (tests/tests/cargo_lambda_watch.rs),
# and a user running the functions locally (infra/README.md).
#
# The venv installs scripts/requirements-package.txt: cargo-lambda, ziglang and pyyaml
# pinned by version and sha256 hash (top-level pins in requirements-package.in; regenerate
# the .txt with pip-compile as its header says). It is rebuilt only when that lock file
# changed (the venv keeps a copy of the one it was built from). Hash-pinned closure:
# --no-deps, wheels only, then `pip check`. About 10 s the first time, nothing after.
#
# Environment:
#   SAS_TOOLS_VENV   venv root (default <repo>/.venv-tools; the venv is its cargo-lambda/)
#   PYTHON           interpreter for the venv (default python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV_ROOT=${SAS_TOOLS_VENV:-$ROOT/.venv-tools}
VENV="$VENV_ROOT/cargo-lambda"
PYTHON=${PYTHON:-python3}
PKG_REQS="$ROOT/scripts/requirements-package.txt"

stamp="$VENV/.sas-reqs"
if [[ ! -x "$VENV/bin/python" || ! -f "$stamp" ]] || ! cmp -s "$PKG_REQS" "$stamp"; then
    printf '==> installing into %s: %s\n' "${VENV#"$ROOT"/}" "${PKG_REQS#"$ROOT"/}" >&2
    rm -rf "$VENV"
    mkdir -p "$VENV_ROOT"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: -r "$PKG_REQS" >&2
    out=$("$VENV/bin/pip" check --disable-pip-version-check 2>&1) || { printf '%s\n' "$out" >&2; exit 2; }
    cp "$PKG_REQS" "$stamp"
fi
[[ -x "$VENV/bin/cargo-lambda" ]] || { printf '==> cargo-lambda not found in %s\n' "$VENV" >&2; exit 2; }
printf '%s\n' "$VENV/bin"
