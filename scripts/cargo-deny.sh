#!/usr/bin/env bash
# Supply-chain checks of the Rust dependency graphs with cargo-deny (deny.toml), of the
# workspace and of fuzz/ (its own workspace and Cargo.lock, built on nightly only):
#   bans      duplicate and banned crates, wildcard version requirements
#   licenses  every crate's license is on deny.toml's allow-list
#   sources   every crate comes from crates.io (no git or other registries)
# Advisories are not checked here: they need the RustSec database from the network,
# which CI does not reach (only the package registries).
#
# cargo-deny is installed on first use into .tools/ (gitignored), pinned and --locked:
# about 4-6 minutes of compiling on a 2-core machine, once.
#
# Environment:
#   SAS_TOOLS_ROOT  install root (default <repo>/.tools)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=${SAS_TOOLS_ROOT:-$ROOT/.tools}
# Bump deliberately; 0.20.2 needs Rust >= 1.88.
VERSION=0.20.2
DENY="$TOOLS/bin/cargo-deny"

if [[ ! -x "$DENY" ]] || [[ "$("$DENY" --version 2>/dev/null)" != "cargo-deny $VERSION" ]]; then
    printf '==> installing cargo-deny %s into %s\n' "$VERSION" "${TOOLS#"$ROOT"/}" >&2
    cargo install --locked --quiet --root "$TOOLS" --version "$VERSION" cargo-deny
fi

cd "$ROOT"
"$DENY" --locked check bans licenses sources
# fuzz/ under the same policy: its Cargo.lock is a supply chain too.
exec "$DENY" --locked --manifest-path fuzz/Cargo.toml --config deny.toml check bans licenses sources
