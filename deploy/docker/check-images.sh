#!/bin/sh
# `make check-images`: the image recipes' steps, run on this machine (images cannot be built
# here): each install script into a fresh virtual environment, then the installed commands
# serve a request: the gateway (compiled) in front of a simulated backend, and the torch
# backend on random weights.
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
cd "$work"  # nothing imports from the source tree
pids=""
cleanup() {
    for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ready() {  # URL: wait up to 60 s for a 200
    for _ in $(seq 1 120); do
        curl -sf -o /dev/null "$1" && return 0
        sleep 0.5
    done
    echo "no answer from $1" >&2
    return 1
}
complete() {  # BASE MODEL: one completion, printed
    curl -sf "$1/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\": \"$2\", \"prompt\": \"hello image\", \"max_tokens\": 4}"
    echo
}

echo "== gateway image: install-gateway.sh"
sh "$src/deploy/docker/install-gateway.sh" "$work/gateway" "$src"
"$work/gateway/bin/kvgate" --version
backend_port=$(port)
gateway_port=$(port)
"$work/gateway/bin/kvgate" backend --port "$backend_port" --cost zero >"$work/sim.log" 2>&1 &
pids="$pids $!"
cat >"$work/policy.yaml" <<POLICY
listen: {host: 127.0.0.1, port: $gateway_port}
pools: {sims: {endpoints: ["127.0.0.1:$backend_port"]}}
routes: [{model: kvgate-sim, pool: sims}]
POLICY
"$work/gateway/bin/kvgate" policy check "$work/policy.yaml"
"$work/gateway/bin/kvgate" gateway --policy "$work/policy.yaml" >"$work/gateway.log" 2>&1 &
pids="$pids $!"
ready "http://127.0.0.1:$backend_port/health"
ready "http://127.0.0.1:$gateway_port/readyz"
complete "http://127.0.0.1:$gateway_port" kvgate-sim
grep -q "request path: compiled" "$work/gateway.log" || { cat "$work/gateway.log"; exit 1; }
"$work/gateway/bin/kvgate" epp --help >/dev/null

echo "== backend image: install-backend.sh"
sh "$src/deploy/docker/install-backend.sh" "$work/backend" "$src"
torch_port=$(port)
"$work/backend/bin/kvgate" backend --runner torch --preset tiny --port "$torch_port" \
    >"$work/torch.log" 2>&1 &
pids="$pids $!"
ready "http://127.0.0.1:$torch_port/health"
complete "http://127.0.0.1:$torch_port" kvgate-tiny
echo "== both recipes installed and served"
