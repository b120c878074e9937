#!/usr/bin/env bash
# Runs CMD with a fresh moto server of its own: installs moto if needed, starts it on
# a free loopback port, exports AWS_ENDPOINT_URL, SAS_TEST_ENDPOINT, dummy
# credentials and AWS_REGION, runs CMD, stops the server, exits with CMD's status.
#
#   infra/with-moto.sh cargo test -p sas-tests
set -euo pipefail
if [[ $# -eq 0 ]]; then
    echo "usage: infra/with-moto.sh CMD [ARGS...]" >&2
    exit 2
fi
INFRA="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SAS_MOTO_STATE="$(mktemp -d "${TMPDIR:-/tmp}/sas-moto.XXXXXX")"
export SAS_MOTO_STATE
cleanup() {
    "$INFRA/moto.sh" stop || true
    rm -rf "$SAS_MOTO_STATE"
}
trap cleanup EXIT
"$INFRA/moto.sh" start >/dev/null
eval "$("$INFRA/moto.sh" env)"
echo "with-moto: moto at $AWS_ENDPOINT_URL" >&2
set +e
"$@"
status=$?
set -e
exit "$status"
