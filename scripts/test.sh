#!/usr/bin/env bash
# The whole test suite, as CI runs it (README.md, "The two commands"). On a fresh machine it
# installs what it needs (moto server, LocalStack, DynamoDB Local, template linters) into
# project-local venvs and folders.
#   SAS_DEV_ORDERS   orders per `sasctl dev` run (default 1000)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }
orders=${SAS_DEV_ORDERS:-1000}

step "citations: every file the docs and comments cite is in the repository"
scripts/check-citations.sh

# LocalStack and DynamoDB Local install (a few minutes, mostly downloads; a no-op once
# installed) in the background while the build below keeps both cores busy.
mkdir -p "${CARGO_TARGET_DIR:-target}"
localstack_install_log="${CARGO_TARGET_DIR:-target}/localstack-install.log"
infra/localstack.sh install >"$localstack_install_log" 2>&1 &
localstack_install=$!
# So do Debian's chromium and chromium-driver for the web console's browser test (apt;
# a no-op once installed), and Selenium into .venv-tools/browser (hash-pinned,
# scripts/requirements-browser.txt).
browser_install_log="${CARGO_TARGET_DIR:-target}/browser-install.log"
{ scripts/browser-deps.sh && scripts/browser-venv.sh; } >"$browser_install_log" 2>&1 &
browser_install=$!

step "build (workspace, all targets)"
# One build serves every step below: each crate is compiled once. Its `sas` carries the
# planted bugs (the simulation's tests turn on the `mutations` feature, and cargo unifies
# features across the workspace), every switch off unless a test sets it; the deployable
# builds never do (checked below).
cargo build --locked --workspace --all-targets
bin="${CARGO_TARGET_DIR:-target}/debug"
export SAS_BOOTSTRAP="$bin/sas-bootstrap"

step "packaged functions carry no planted bugs"
scripts/check-no-mutations.sh "$bin"

step "tools: cargo-lambda into .venv-tools (the cargo lambda watch test needs it)"
# Pinned and hash-checked (scripts/requirements-package.txt); a no-op once installed.
scripts/cargo-lambda-venv.sh >/dev/null

step "tests: unit, handler, conformance (embedded + moto), end to end over moto and under cargo lambda watch"
# with-moto.sh starts moto on loopback (one request at a time), exports its endpoint,
# runs the command and stops moto. With CI=true, emulator-backed tests never skip.
infra/with-moto.sh cargo test --locked --workspace

step "web console in a browser: sasctl up over moto, headless Chromium completes a callback from the page (screenshots: ${CARGO_TARGET_DIR:-target}/console-screenshots)"
# cli/tests/console_browser.rs, ignored by the step above; with CI=true a missing browser fails it.
# --workspace, as above, so the test is the one already built (the same features).
if ! wait "$browser_install"; then
    cat "$browser_install_log" >&2
    echo "scripts/browser-deps.sh or scripts/browser-venv.sh failed (the output is above)" >&2
    exit 1
fi
SAS_BROWSER_PYTHON="$(scripts/browser-venv.sh)" \
    infra/with-moto.sh cargo test --locked --workspace --test console_browser -- --ignored

step "tests: conformance, the four functions under cargo lambda watch, and sasctl up, on LocalStack + DynamoDB Local"
# The same two suites on the emulators users run: Amazon's DynamoDB Local for the state
# table, LocalStack for SQS and SNS (infra/with-localstack.sh; docs/DEPLOY.md lists how
# they differ from moto). The build above made the test binaries.
if ! wait "$localstack_install"; then
    cat "$localstack_install_log" >&2
    echo "infra/localstack.sh install failed (its output is above)" >&2
    exit 1
fi
infra/with-localstack.sh cargo test --locked --workspace --test conformance --test cargo_lambda_watch --test up_split

step "sasctl dev: $orders single-step orders with failures and hangs injected"
"$bin/sasctl" dev --orders "$orders" --workflow single-step --failure-rate 0.2 --hang-rate 0.05

step "sasctl dev: $orders three-step orders with failures and hangs injected"
"$bin/sasctl" dev --orders "$orders" --workflow three-step --failure-rate 0.2 --hang-rate 0.05

step "sasctl dev: $orders orders of examples/parallel.json (a 3-branch stage) with failures and hangs injected"
"$bin/sasctl" dev --orders "$orders" --workflows examples/parallel.json --workflow parallel-order --failure-rate 0.2 --hang-rate 0.05

step "sasctl dev: $orders orders of examples/map.json (a map over each order's lines) with failures and hangs injected"
"$bin/sasctl" dev --orders "$orders" --workflows examples/map.json --workflow map-order --failure-rate 0.2 --hang-rate 0.05

step "sasctl dev: $orders orders of examples/flow-control.json (agents with max_in_flight and max_per_second) with failures and hangs injected"
"$bin/sasctl" dev --orders "$orders" --workflows examples/flow-control.json --failure-rate 0.2 --hang-rate 0.05

step "template: cfn-lint and checkov"
scripts/lint-template.sh

step "supply chain: cargo deny check bans licenses sources"
scripts/cargo-deny.sh

step "all tests passed"
