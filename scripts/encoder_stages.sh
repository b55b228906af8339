#!/usr/bin/env bash
# Where a semantic lookup's time goes with the remote encoder against in-process int8 MiniLM, in one run on this
# machine's CPU (docs/reports/cache-encoder.md, "Lookup stages"). The encoder service is the loopback stub
# (fleetgate.bench.encoder_stub): a first, unreported pass makes it compute every prompt's fp32 MiniLM vector once
# (ONNX, in its own process) and keep it; the measured pass is then answered from memory, a stand-in for a GPU
# encoder, so the remote row's embed stage is the gateway's side (tokenizer, HTTP, decode) plus loopback.
# Both measured passes use the same seed, prompts, entries and loads. Everything is bounded in time and stops.
#
#   ENTRIES=20000 QUERIES=200 bash scripts/encoder_stages.sh            # from the repository root, venv on PATH
set -uo pipefail
cd "$(dirname "$0")/.."
ENTRIES=${ENTRIES:-20000}
QUERIES=${QUERIES:-200}
PORT=$(python -c "from fleetgate.core.localredis import free_port; print(free_port())")
URL=http://127.0.0.1:$PORT
timeout 1200 python -m fleetgate.bench.encoder_stub --port "$PORT" --no-table >/dev/null 2>&1 &
STUB=$!
trap 'kill "$STUB" 2>/dev/null' EXIT
for _ in $(seq 1 60); do curl -s -o /dev/null "$URL/v1/models" && break; sleep 1; done
run() {  # embedder, entries, extra args...
  local embedder=$1 entries=$2; shift 2
  timeout 600 fleetgate cache-eval --embedder "$embedder" --latency-only --entries "$entries" --queries "$QUERIES" \
    --loads 0.5 0.9 --encoder-timeout-ms 1000 "$@"
}
echo "== warm-up (not reported): the stub computes and keeps every prompt's vector"
run remote 1000 --encoder-url "$URL" >/dev/null || { echo "warm-up failed"; exit 1; }
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== in-process minilm-onnx-int8 (baseline)"
run minilm-onnx-int8 "$ENTRIES"
echo "== remote (stub answering from memory)"
run remote "$ENTRIES" --encoder-url "$URL"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
