#!/usr/bin/env bash
# Time from `start` to answering for moto (infra/moto.sh) and for LocalStack with DynamoDB
# Local (infra/localstack.sh), each from a fresh state directory, alternating, N rounds
# (default 5); both must be installed already (`install`), so only the start is timed.
#
#   infra/emulator-start-times.sh [N]
set -euo pipefail
INFRA="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rounds="${1:-5}"
"$INFRA/moto.sh" install
"$INFRA/localstack.sh" install
seconds() {
    local start end
    start=$(date +%s%N)
    "$@" >/dev/null
    end=$(date +%s%N)
    printf '%d.%03d' $(((end - start) / 1000000000)) $((((end - start) / 1000000) % 1000))
}
for ((i = 1; i <= rounds; i++)); do
    state="$(mktemp -d)"
    t=$(SAS_MOTO_STATE="$state" seconds "$INFRA/moto.sh" start)
    SAS_MOTO_STATE="$state" "$INFRA/moto.sh" stop
    rm -rf "$state"
    echo "round $i: moto $t s"
    state="$(mktemp -d)"
    t=$(SAS_LOCALSTACK_STATE="$state" seconds "$INFRA/localstack.sh" start)
    SAS_LOCALSTACK_STATE="$state" "$INFRA/localstack.sh" stop
    rm -rf "$state"
    echo "round $i: localstack + dynamodb-local $t s"
done
