#!/usr/bin/env bash
# Fails if a deployable function build would carry the planted bugs (`sas::mutations`).
#
# The simulation's tests switch the `mutations` feature on, and a workspace build with
# --all-targets unifies it into every crate; a deployable build (scripts/package.sh, sam
# build: one function package at a time, no dev-dependencies) must not have it.
#
#   scripts/check-no-mutations.sh                 the feature graph of each function's build
#   scripts/check-no-mutations.sh DIR             also: DIR's submission (a workspace
#                                                 test build) does hold the marker, so the
#                                                 binary check below is not blind
#   scripts/check-no-mutations.sh --binary FILE   FILE does not hold the marker
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MARKER=sas-planted-bugs-are-compiled-in

if [[ ${1:-} == --binary ]]; then
    shift
    for file in "$@"; do
        if grep -qaF "$MARKER" "$file"; then
            echo "check-no-mutations: $file was built with the mutations feature (planted bugs); refusing it" >&2
            exit 1
        fi
    done
    exit 0
fi

for function in submission scheduler agent supervisor; do
    if cargo tree --locked -q -e features,no-dev -p "$function" -i sas | grep -q 'feature "mutations"'; then
        echo "check-no-mutations: the $function build enables sas's mutations feature (planted bugs)" >&2
        exit 1
    fi
done
if [[ $# -gt 0 ]]; then
    if ! grep -qaF "$MARKER" "$1/submission"; then
        echo "check-no-mutations: $1/submission lacks the marker although the workspace build enables mutations: the binary check would be blind" >&2
        exit 1
    fi
fi
echo "check-no-mutations: no function build enables mutations"
