#!/usr/bin/env bash
# The semantic cache's encoder on a GPU: all-MiniLM-L6-v2 served by vLLM's pooling runner (the flags the operator
# renders for `engine.task: embed`, float32, a small --gpu-memory-utilization: it shares the card with an LLM
# engine), its own throughput and p99, then the gateway with `semantic.embedder: remote` against it, then the
# cache's decisions and its 100k-entry lookup latency through it. Results under $OUT.
#
# On the GPU machine (Python 3.12, vLLM 0.26.0 from the kit, no fleetgate installed), from the repository root:
#   earlier runs: the kit's parts and `.gpu-kit/minilm.tar.xz` (scripts/gpu/pack_minilm.py) into /root/stage/
#   bash scripts/gpu/embed_bench.sh
# Here, a dry run on vLLM CPU: DEVICE=cpu PYTHON=/work/main/.venv/bin/python OUT=/tmp/eb bash scripts/gpu/embed_bench.sh
#
# Knobs (environment): OUT, PYTHON, DEVICE (cuda|cpu), GPU_UTIL (0.05), PORT (8111), EAGER (1: --enforce-eager),
# DTYPE (float32; float16 to see what the GPU's default precision does to the decisions),
# PHASES ("service gateway cache"), DURATION (s per throughput phase, 4), ENTRIES (100000), MINILM (pack path),
# TIMEOUT_MS (the cache's bound on a lookup's wait for the encoder; unset: the shipped 100 ms).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/embed-bench}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
GPU_UTIL=${GPU_UTIL:-0.05}
PORT=${PORT:-8111}
PHASES=${PHASES:-service gateway cache}
DURATION=${DURATION:-4}
ENTRIES=${ENTRIES:-100000}
MODELS=${MODELS:-/root/minilm}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/embed_bench.log") 2>&1
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

# -- vLLM: the kit when the machine has none ------------------------------------------------------------------------
if ! "$PYTHON" -c "import vllm" 2>/dev/null; then
  # shellcheck disable=SC1091
  source .gpu-kit/install.sh .gpu-kit || { say "no vLLM and no kit: stage the kit first (../shared/gpu/README.md)"; exit 3; }
fi
"$PYTHON" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" | tee "$OUT/versions.txt"

# -- FleetGate from the repository, not installed ----------------------------------------------------------------------
"$PYTHON" -c "import sys; sys.path.insert(0, 'scripts'); import static_checks; print(static_checks.assemble())"
export PYTHONPATH="$ROOT/build/tree${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
missing=$("$PYTHON" - <<'PY'
import importlib
need = ["fastapi", "uvicorn", "uvloop", "aiohttp", "orjson", "pydantic", "yaml", "prometheus_client", "httpx",
        "numpy", "faiss", "onnxruntime", "onnx", "tokenizers", "wordfreq", "rapidfuzz", "snowballstemmer", "safetensors"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then say "missing Python packages: $missing (build the kit with them as EXTRA_PACKAGE)"; exit 4; fi
"$PYTHON" -c "import fleetgate; print('fleetgate from', fleetgate.__file__)"

# -- MiniLM: the packaged weights (float16 in transit, float32 here) and what the gateway derives from them ---------
export FLEETGATE_MODEL_DIR=$MODELS
DIR=$MODELS/all-MiniLM-L6-v2
if [ ! -f "$DIR/model.safetensors" ]; then
  PACK=${MINILM:-}
  for p in .gpu-kit/minilm.tar.xz /root/stage/minilm.tar.xz; do [ -z "$PACK" ] && [ -f "$p" ] && PACK=$p; done
  if [ -z "$PACK" ]; then
    if [ "$DEVICE" = cpu ]; then  # the dry run: the package's own files
      DIR=$("$PYTHON" -c "from fleetgate.core.minilm import minilm_dir; print(minilm_dir())"); MODELS=$(dirname "$DIR")
      export FLEETGATE_MODEL_DIR=$MODELS
    else
      say "no .gpu-kit/minilm.tar.xz nor /root/stage/minilm.tar.xz (python3 scripts/gpu/pack_minilm.py)"; exit 5
    fi
  else
    mkdir -p "$MODELS" && tar -xJf "$PACK" -C "$MODELS" || { say "unpacking $PACK failed"; exit 5; }
    "$PYTHON" - "$DIR" <<'PY'
import sys
from pathlib import Path
import numpy as np
from safetensors.numpy import load_file, save_file
d = Path(sys.argv[1])
w = load_file(str(d / "model.fp16.safetensors"))
save_file({k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in w.items()}, str(d / "model.safetensors"))
(d / "model.fp16.safetensors").unlink()
PY
  fi
fi
say "MiniLM in $DIR; exporting the ONNX graphs and the static table the gateway uses (once)"
"$PYTHON" -m fleetgate.core.minilm_export --model-dir "$DIR" >/dev/null 2>"$OUT/export.err" || { say "ONNX export failed"; tail "$OUT/export.err"; exit 6; }
"$PYTHON" -m fleetgate.core.minilm_static --model-dir "$DIR" >/dev/null 2>"$OUT/static.err" || { say "static table failed"; tail "$OUT/static.err"; exit 6; }

# -- the encoder engine, from the operator's own rendering -----------------------------------------------------------
mapfile -t ARGS < <("$PYTHON" - "$DIR" "$PORT" "$GPU_UTIL" "${EAGER:-0}" "$DEVICE" "${DTYPE:-float32}" <<'PY'
import dataclasses, sys
from fleetgate.operator.resolve import engine_args_for
from fleetgate.operator.spec import parse_spec
model, port, util, eager, device, dtype = sys.argv[1:]
engine = {"task": "embed", "dtype": dtype, "gpuMemoryUtilization": float(util), "enforceEager": eager == "1"}
resources = {"gpus": 1} if device != "cpu" else {"accelerator": "cpu", "gpus": 0}
spec = parse_spec({"model": {"source": model, "servedName": "all-minilm-l6-v2"}, "engine": engine, "resources": resources})
args = dataclasses.replace(engine_args_for(spec=spec, name="minilm"), host="127.0.0.1", port=int(port))
print("\n".join(args.to_argv()))
PY
)
URL=http://127.0.0.1:$PORT
if [ "$DEVICE" = cpu ]; then
  export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
say "starting: vllm ${ARGS[*]}"
setsid "$PYTHON" -m vllm.entrypoints.openai.api_server "${ARGS[@]}" > "$OUT/vllm.log" 2>&1 &
VLLM_PID=$!
stop_engine() { kill -TERM -- -"$VLLM_PID" 2>/dev/null; sleep 3; kill -KILL -- -"$VLLM_PID" 2>/dev/null; }
trap stop_engine EXIT
for _ in $(seq 1 600); do
  curl -sf "$URL/health" >/dev/null 2>&1 && break
  kill -0 "$VLLM_PID" 2>/dev/null || { say "vLLM exited"; tail -30 "$OUT/vllm.log"; exit 7; }
  sleep 1
done
curl -sf "$URL/health" >/dev/null || { say "vLLM not healthy after 600 s"; tail -30 "$OUT/vllm.log"; exit 7; }
ready=$(date +%s)
say "vLLM ready: $URL"
grep -E "Model loading took|model weights took|peak|non_torch|CUDA graph|Available KV|Supported tasks|dtype=torch|Resolved pooling" \
  "$OUT/vllm.log" | cut -c1-400 > "$OUT/vllm_memory.txt"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/nvidia_smi.txt"

phase() {  # name, time limit (s), command...
  local name=$1 limit=$2; shift 2
  say "phase $name (at most ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  echo "rc=$?" >> "$OUT/$name.txt"
  cat "$OUT/$name.txt"
}
for p in $PHASES; do
  case $p in
    service)
      phase encoder_service 60 "$PYTHON" -m fleetgate bench encoder-service --url "$URL" --duration "$DURATION" \
        --concurrency 64 --batch 32 --json "$OUT/encoder_service.json" ;;
    gateway)
      phase bench_gateway 240 "$PYTHON" -m fleetgate bench gateway --embedder minilm-onnx-int8 remote \
        --encoder-url "$URL" --workloads "lookup miss (varied)" "semantic hit" --loadgen python \
        --requests 400 --duration "$DURATION" --stream-requests 0 --gateway-cpu 0 \
        ${TIMEOUT_MS:+--encoder-timeout-ms "$TIMEOUT_MS"} ;;
    cache)
      phase cache_eval 300 "$PYTHON" -m fleetgate cache-eval --embedder remote --encoder-url "$URL" --latency-only \
        --compare minilm-onnx --entries "$ENTRIES" --queries 150 --loads 0.9 --frozen "$ROOT/tests/data/eval" \
        --train "$ROOT/cache/data" ${TIMEOUT_MS:+--encoder-timeout-ms "$TIMEOUT_MS"} ;;
  esac
done
say "phases took $(( $(date +%s) - ready ))s after the engine was ready"
grep -E "Avg prompt throughput|pooling" "$OUT/vllm.log" | tail -3 > "$OUT/vllm_tail.txt"
