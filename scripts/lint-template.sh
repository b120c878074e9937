#!/usr/bin/env bash
# Lint template.yaml offline, without an AWS account:
#   1. cfn-lint on the SAM template,
#   2. cfn-lint on the SAM-transformed template (aws-sam-translator, offline),
#   3. project contract checks on the transformed template (check-template-contract.py),
#   4. checkov (--skip-download) on the SAM template, on the transformed one, and on the
#      SAM template with the optional callback endpoint turned on (EnableCallbackApi),
#   5. sam validate --lint,
#   6. optionally (SAS_LINT_SAM_BUILD=1) sam build.
# Exits non-zero on any cfn-lint error or warning, any failed checkov check, or any
# sam validate failure. Every checkov skip carries its reason inline in template.yaml.
#
# The tools live in project venvs under .venv-tools/ (gitignored), installed from PyPI on
# first run (about 1 min cold, two venvs installed in parallel because checkov and
# aws-sam-cli pin conflicting boto3/packaging versions) and reused afterwards. Each venv
# installs a lock file next to this script that pins its whole dependency closure with
# == and sha256 hashes (pip --require-hashes, wheels only): requirements-cfn-sam.txt
# (requirements-cfn.txt with SAS_LINT_SAM=0) and requirements-checkov.txt. A venv is
# rebuilt when its lock file changed. To bump a tool, edit the matching .in file and
# regenerate the .txt with pip-compile as its header says.
#
# Usage: scripts/lint-template.sh [template]   (default: template.yaml at the repo root)
#
# Environment:
#   SAS_TOOLS_VENV  venv root (default <repo>/.venv-tools, shared with scripts/package.sh)
#   SAS_LINT_SAM=0  skip the aws-sam-cli venv and `sam validate --lint` (cfn-lint and
#                   the SAM translator still run, from the checkov-free venv)
#   SAS_LINT_SAM_BUILD=1  also run `sam build` (compiles the four functions for arm64:
#                   minutes; needs cargo-lambda, e.g. from scripts/package.sh's venv)
#   PYTHON          interpreter for the venvs (default python3, needs >= 3.9)
#   SAS_BOOTSTRAP   a built sas-bootstrap, for the functions' variable list (the test
#                   command passes its own build's); unset, `cargo run` builds one
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TEMPLATE=$(realpath "${1:-$ROOT/template.yaml}")
VENV_ROOT=${SAS_TOOLS_VENV:-$ROOT/.venv-tools}
PYTHON=${PYTHON:-python3}
WITH_SAM=${SAS_LINT_SAM:-1}

# Pinned so CI and laptops judge the template with the same rules. Bump deliberately:
# top-level pins in scripts/requirements-*.in, hash-pinned closures in the .txt files.
CFN_REQS="$ROOT/scripts/requirements-cfn.txt"         # cfn-lint, aws-sam-translator
CFN_SAM_REQS="$ROOT/scripts/requirements-cfn-sam.txt" # the same plus aws-sam-cli
CHECKOV_REQS="$ROOT/scripts/requirements-checkov.txt"

# Transform and lint need a region; nothing talks to AWS.
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}
export AWS_REGION=${AWS_REGION:-$AWS_DEFAULT_REGION}
export SAM_CLI_TELEMETRY=0
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '==> %s\n' "$*" >&2; }

# ensure_venv <dir> <lock file>: create/refresh a venv only when its lock file changed
# (the venv keeps a copy of the file it was built from). Every package comes from the
# lock file, pinned by version and sha256 hash; --no-deps because the file already holds
# the whole closure (pip-compile), wheels only so nothing is built with unpinned build
# tools; `pip check` then proves the closure is complete and consistent.
ensure_venv() {
    local dir=$1 reqs=$2
    local stamp="$dir/.sas-lint-reqs" out
    if [[ -x "$dir/bin/python" && -f "$stamp" ]] && cmp -s "$reqs" "$stamp"; then
        return 0
    fi
    log "installing into ${dir#"$ROOT"/}: ${reqs#"$ROOT"/}"
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    "$dir/bin/pip" install --quiet --require-hashes --no-deps --only-binary :all: -r "$reqs"
    out=$("$dir/bin/pip" check 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
    cp "$reqs" "$stamp"
}

START=$(date +%s)
mkdir -p "$VENV_ROOT"
CFN_VENV="$VENV_ROOT/cfn"
CHECKOV_VENV="$VENV_ROOT/checkov"
cfn_reqs=$CFN_REQS
[[ $WITH_SAM == 1 ]] && cfn_reqs=$CFN_SAM_REQS

# Install both venvs in parallel (pip is mostly network and unpacking).
pids=()
ensure_venv "$CFN_VENV" "$cfn_reqs" &
pids+=($!)
ensure_venv "$CHECKOV_VENV" "$CHECKOV_REQS" &
pids+=($!)
for pid in "${pids[@]}"; do
    wait "$pid" || { log "tool installation failed"; exit 2; }
done
log "tools ready in $(($(date +%s) - START)) s"

OUT="$VENV_ROOT/out"
mkdir -p "$OUT"
TRANSFORMED="$OUT/template.transformed.json"
rm -f "$TRANSFORMED" "$OUT"/checkov-*.json # never judge a previous run's output
failures=0
fail() {
    log "FAILED: $*"
    failures=$((failures + 1))
}

# 1. cfn-lint on the SAM template (fails on errors and warnings).
log "cfn-lint ${TEMPLATE##*/}"
if "$CFN_VENV/bin/cfn-lint" --non-zero-exit-code warning -- "$TEMPLATE"; then
    log "cfn-lint ${TEMPLATE##*/}: 0 errors, 0 warnings"
else
    fail "cfn-lint ${TEMPLATE##*/}"
fi

# 2. Transform offline and lint what CloudFormation will actually create.
log "SAM transform -> ${TRANSFORMED#"$ROOT"/}"
if "$CFN_VENV/bin/python" - "$TEMPLATE" "$TRANSFORMED" <<'PY'; then
import json
import sys

from samtranslator.translator.managed_policy_translator import ManagedPolicyLoader
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class NoManagedPolicies(ManagedPolicyLoader):
    """The template names no managed policies; never call IAM."""

    def __init__(self):
        super().__init__(iam_client=None)

    def load(self):
        return {}


with open(sys.argv[1], encoding="utf-8") as f:
    sam = yaml_parse(f.read())
# What `sam package` does: local CodeUri -> the S3 object it uploaded.
placeholder = "s3://sas-lint-placeholder/code.zip"
if "CodeUri" in sam.get("Globals", {}).get("Function", {}):
    sam["Globals"]["Function"]["CodeUri"] = placeholder
for r in sam["Resources"].values():
    if r.get("Type") == "AWS::Serverless::Function" and "CodeUri" in r.get("Properties", {}):
        r["Properties"]["CodeUri"] = placeholder
# Parameters without a default need a value for the transform only.
params = {"RemoteServiceUrl": "https://remote.example.com"}
cfn = transform(sam, params, NoManagedPolicies())
with open(sys.argv[2], "w", encoding="utf-8") as f:
    json.dump(cfn, f, indent=1, sort_keys=True)
types = {}
for r in cfn["Resources"].values():
    types[r["Type"]] = types.get(r["Type"], 0) + 1
print("transformed: %d resources: %s" % (
    len(cfn["Resources"]), ", ".join("%s x%d" % kv for kv in sorted(types.items()))), file=sys.stderr)
PY
    log "cfn-lint transformed template"
    if "$CFN_VENV/bin/cfn-lint" --non-zero-exit-code warning -- "$TRANSFORMED"; then
        log "cfn-lint transformed: 0 errors, 0 warnings"
    else
        fail "cfn-lint transformed template"
    fi
else
    fail "SAM transform"
fi

# 2b. Project contract checks no generic linter knows: names, 6x visibility, redrive,
#     batch failures, hand-written IAM without wildcards, an alarm on every DLQ, and a
#     dashboard body that is valid JSON once substituted.
#     Each function's environment is checked against the code's one variable list.
if [[ -f $TRANSFORMED ]]; then
    log "contract checks"
    VARIABLES="$OUT/variables.json"
    # The test command passes the binary it built (SAS_BOOTSTRAP), so nothing is compiled twice.
    if (cd "$ROOT" && if [[ -n ${SAS_BOOTSTRAP:-} ]]; then "$SAS_BOOTSTRAP" --variables --json;
        else cargo run --locked -q -p sas-bootstrap -- --variables --json; fi) >"$VARIABLES"; then
        "$CFN_VENV/bin/python" "$ROOT/scripts/check-template-contract.py" "$TRANSFORMED" "$VARIABLES" \
            || fail "contract checks"
    else
        fail "contract checks: sas-bootstrap --variables"
    fi
fi

# 3. checkov: SAM template (inline skips) and the transformed template.
run_checkov() {
    local file=$1 name=$2 report="$OUT/checkov-$2.json"
    log "checkov $name"
    local rc=0
    "$CHECKOV_VENV/bin/checkov" --skip-download --quiet --compact --framework cloudformation \
        --file "$file" --output cli --output json --output-file-path "console,$report" || rc=$?
    if [[ $rc -ne 0 ]]; then
        fail "checkov $name (exit $rc)"
    fi
    "$CHECKOV_VENV/bin/python" - "$report" "$name" <<'PY' || fail "checkov $name summary"
import json
import sys

data = json.load(open(sys.argv[1]))
reports = data if isinstance(data, list) else [data]
passed = failed = skipped = 0
for r in reports:
    s = r.get("summary", {})
    passed += s.get("passed", 0)
    failed += s.get("failed", 0)
    skipped += s.get("skipped", 0)
print("==> checkov %s: %d passed, %d failed, %d skipped" % (sys.argv[2], passed, failed, skipped), file=sys.stderr)
sys.exit(1 if failed or passed == 0 else 0)
PY
}
run_checkov "$TEMPLATE" template
[[ -f $TRANSFORMED ]] && run_checkov "$TRANSFORMED" transformed
# checkov leaves out resources whose Condition is false under the parameters' defaults, so
# the optional callback endpoint (EnableCallbackApi, off by default) is judged on a copy
# of the template with it on. cfn-lint and the contract checks see every resource anyway.
WITH_API="$OUT/template.callback-api.yaml"
sed '/^  EnableCallbackApi:$/,/^    Default:/ s/^    Default: "false"$/    Default: "true"/' "$TEMPLATE" >"$WITH_API"
if grep -A2 '^  EnableCallbackApi:$' "$WITH_API" | grep -q '^    Default: "true"$'; then
    run_checkov "$WITH_API" callback-api
else
    fail "checkov callback-api: could not turn EnableCallbackApi on in a copy of the template"
fi

# 4. sam validate --lint (no credentials needed).
if [[ $WITH_SAM == 1 ]]; then
    log "sam validate --lint"
    if (cd "$ROOT" && "$CFN_VENV/bin/sam" validate --lint --template-file "$TEMPLATE" --region "$AWS_DEFAULT_REGION"); then
        :
    else
        fail "sam validate --lint"
    fi
fi

# 6. Optional (minutes of CPU, so not in the default test run): `sam build`, which runs
#    cargo lambda for each function exactly as a SAM deployment does.
if [[ $WITH_SAM == 1 && ${SAS_LINT_SAM_BUILD:-0} == 1 ]]; then
    log "sam build (cargo lambda build --release --arm64 per function)"
    PATH="$VENV_ROOT/cargo-lambda/bin:$PATH"
    if (cd "$ROOT" && "$CFN_VENV/bin/sam" build --template-file "$TEMPLATE" --build-dir "$OUT/sam-build"); then
        :
    else
        fail "sam build"
    fi
fi

log "done in $(($(date +%s) - START)) s, $failures failing check(s)"
[[ $failures -eq 0 ]]
