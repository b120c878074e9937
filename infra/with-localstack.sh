#!/usr/bin/env bash
# Runs CMD with a fresh LocalStack and DynamoDB Local of its own: installs them if needed,
# starts them on free ports, exports the per-service endpoints (AWS_ENDPOINT_URL_DYNAMODB,
# _SQS, _SNS, _SSM, _SECRETS_MANAGER), SAS_TEST_ENDPOINT_DYNAMODB, _SQS and _SNS, dummy
# credentials and AWS_REGION (and unsets AWS_ENDPOINT_URL and SAS_TEST_ENDPOINT), runs CMD,
# stops both, exits with CMD's status.
#
#   infra/with-localstack.sh cargo test -p sas-tests --test conformance
set -euo pipefail
if [[ $# -eq 0 ]]; then
    echo "usage: infra/with-localstack.sh CMD [ARGS...]" >&2
    exit 2
fi
INFRA="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SAS_LOCALSTACK_STATE="$(mktemp -d "${TMPDIR:-/tmp}/sas-localstack.XXXXXX")"
export SAS_LOCALSTACK_STATE
cleanup() {
    "$INFRA/localstack.sh" stop || true
    rm -rf "$SAS_LOCALSTACK_STATE"
}
trap cleanup EXIT
"$INFRA/localstack.sh" start >/dev/null
eval "$("$INFRA/localstack.sh" env)"
echo "with-localstack: DynamoDB Local at $AWS_ENDPOINT_URL_DYNAMODB, LocalStack at $AWS_ENDPOINT_URL_SQS" >&2
set +e
"$@"
status=$?
set -e
exit "$status"
