#!/usr/bin/env bash
# moto server for local runs and tests: installed into a project venv, listening on
# loopback, serving one request at a time (see moto_server.py for why).
#
#   infra/moto.sh install   create infra/.venv and pip install moto (pinned)
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
MOTO_VERSION="5.2.5"
HOST=127.0.0.1
PY="$VENV/bin/python"

installed() {
    [[ -x "$PY" ]] && "$PY" - "$MOTO_VERSION" <<'PY' 2>/dev/null
import sys, importlib.metadata as m
sys.exit(0 if m.version("moto") == sys.argv[1] and m.version("flask") else 1)
PY
}

install() {
    if installed; then return 0; fi
    echo "moto: installing moto[server]==$MOTO_VERSION into $VENV" >&2
    if [[ ! -x "$PY" ]]; then
        "${PYTHON:-python3}" -m venv "$VENV"
    fi
    "$PY" -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2
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
