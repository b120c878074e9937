#!/usr/bin/env bash
# Creates the sas state table (with the due index), queues with their dead-letter queues,
# the status queue and the alerts topic, against AWS_ENDPOINT_URL (moto, LocalStack)
# or AWS itself; prints the functions' configuration as NAME=value lines.
#
#   AWS_ENDPOINT_URL=http://127.0.0.1:4566 infra/bootstrap.sh --prefix sas > .env.local
#   infra/bootstrap.sh --help
#
# Names and settings match template.yaml; both come from one definition in
# shared/src/adapters/aws/provision.rs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec cargo run --quiet -p sas-bootstrap -- "$@"
