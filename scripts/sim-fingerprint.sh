#!/usr/bin/env bash
# The simulation's fingerprint: its totals over SEEDS seeds (default 3000: orders, invocations, final states,
# faults, counters, the transition coverage; the timing line left out) and the trace hash
# of each of the first HASHES seeds (default 300). A change that decides nothing
# differently (a refactor, a speed-up) leaves the fingerprint byte for byte as it was:
#   scripts/sim-fingerprint.sh > before.txt; (change); scripts/sim-fingerprint.sh > after.txt
#   diff before.txt after.txt
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${SEEDS:-3000}
hashes=${HASHES:-300}
cargo build --release --locked -q -p sas-sim
bin="${CARGO_TARGET_DIR:-target}/release/sas-sim"
SIM_SEEDS=$seeds "$bin" | sed -E 's/ in [0-9.]+s: [0-9]+ seeds\/s on [0-9]+ threads//'
SIM_SEEDS=$hashes SIM_HASHES=1 SIM_THREADS=1 "$bin"
