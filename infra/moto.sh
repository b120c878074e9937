#!/usr/bin/env bash
# moto server for local runs and tests: installed into a project venv, listening on
# loopback, serving one request at a time (see moto_server.py for why).
#
#   infra/moto.sh install   create infra/.venv from requirements-moto.txt (hash-pinned)
#   infra/moto.sh start     install if needed, start, print the endpoint
#   infra/moto.sh stop      stop the server this state dir started
#   infra/moto.sh status    endpoint and pid, or "not running" (exit 1)
#   infra/moto.sh env       export lines for AWS_ENDPOINT_URL, dummy credentials,
#                           AWS_REGION and SAS_TEST_ENDPOINT: eval "$(infra/moto.sh env)"
#
# SAS_MOTO_STATE picks the directory holding pid, port and log (default
# infra/.moto), so separate runs can each have their own server.
set -euo pipefail

INFRA="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${SAS_MOTO_VENV:-$INFRA/.venv}"
STATE="${SAS_MOTO_STATE:-$INFRA/.moto}"
# moto[server] (pinned in requirements-moto.in) and its whole dependency closure, pinned
# by version and sha256 hash; regenerate with pip-compile as the file's header says.
REQS="$INFRA/requirements-moto.txt"
STAMP="$VENV/.sas-reqs" # copy of the lock file the venv was built from
HOST=127.0.0.1
PY="$VENV/bin/python"

installed() {
    [[ -x "$PY" && -f "$STAMP" ]] && cmp -s "$REQS" "$STAMP"
}

# (Re)build the venv when the lock file changed: a fresh venv when it is ours (the
# default infra/.venv, or one this script built; a venv of your own named by
# SAS_MOTO_VENV is installed into, never cleared), every package from the lock file
# (--no-deps, it holds the closure; wheels only, so nothing is built with unpinned build
# tools), then `pip check` for a complete, consistent closure.
install() {
    if installed; then return 0; fi
    echo "moto: installing ${REQS#"$INFRA"/} into $VENV" >&2
    local clear="" out
    if [[ -f "$VENV/pyvenv.cfg" ]] && [[ -f "$STAMP" || "$VENV" == "$INFRA/.venv" ]]; then
        clear=--clear
    fi
    # shellcheck disable=SC2086
    "${PYTHON:-python3}" -m venv $clear "$VENV"
    "$PY" -m pip install --quiet --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: -r "$REQS" >&2
    out=$("$PY" -m pip check --disable-pip-version-check 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
    cp "$REQS" "$STAMP"
}

pid() { [[ -f "$STATE/pid" ]] && cat "$STATE/pid"; }
alive() { local p; p="$(pid)" && [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }
endpoint() { echo "http://$HOST:$(cat "$STATE/port")"; }

start() {
    if alive; then endpoint; return 0; fi
    install
    mkdir -p "$STATE"
    rm -f "$STATE/port" "$STATE/pid"
    nohup "$PY" "$INFRA/moto_server.py" "$HOST" "$STATE/port" >"$STATE/log" 2>&1 &
    echo $! >"$STATE/pid"
    # Ready when it has written its port and answers HTTP.
    for _ in $(seq 1 300); do
        if ! alive; then
            echo "moto: exited during start; log follows" >&2
            cat "$STATE/log" >&2
            return 1
        fi
        if [[ -s "$STATE/port" ]] && "$PY" - "$(endpoint)" <<'PY' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/moto-api/data.json", timeout=1).read()
PY
            endpoint
            return 0
        fi
        sleep 0.1
    done
    echo "moto: not ready after 30 s; log follows" >&2
    cat "$STATE/log" >&2
    stop
    return 1
}

stop() {
    local p
    p="$(pid || true)"
    if [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; then
        kill "$p"
        for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$p" 2>/dev/null; then kill -9 "$p" 2>/dev/null || true; fi
    fi
    rm -f "$STATE/pid" "$STATE/port"
}

status() {
    if alive; then echo "moto: $(endpoint) (pid $(pid))"; else echo "moto: not running"; return 1; fi
}

env_lines() {
    alive || { echo "moto: not running (infra/moto.sh start)" >&2; return 1; }
    local e; e="$(endpoint)"
    cat <<ENV
export AWS_ENDPOINT_URL=$e
export SAS_TEST_ENDPOINT=$e
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
ENV
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) env_lines ;;
    *) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
