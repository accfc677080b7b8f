#!/bin/bash
# Every GPU check and benchmark in one go, for a machine with an NVIDIA GPU, CuPy and PyTorch,
# most important first, each stage under its own time limit; logs and records go to $1.
#   bash benchmarks/gpu_all.sh results/  [matmul seconds] [layer-norm seconds]
out=${1:-gpu-results}; mm=${2:-330}; ln=${3:-60}  # about 9.5 minutes in all on an H200
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{ date -u; nvidia-smi -L; nvcc --version | tail -2; python3 -c "import cupy, torch, numpy, xgboost; print('cupy', cupy.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__, 'xgboost', xgboost.__version__)"; lscpu | grep 'Model name'; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
timeout 120 python3 benchmarks/gpu_smoke.py 2>&1 | tee "$out/smoke.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "smoke test failed: stopping"; exit 1; }
timeout 100 python3 benchmarks/gpu_checks.py --per-sketch 4 --cuda-run --no-pocl --oclgrind 0 --jobs 16 2>&1 | tee "$out/checks.log"
timeout $((mm + 70)) python3 benchmarks/gpu.py --only matmul_4096 --trials 1000 --time-budget "$mm" \
    --database "$out/gpu.db" --json "$out/gpu.jsonl" 2>&1 | tee "$out/tune.log"
timeout $((ln + 80)) python3 benchmarks/gpu.py --only layer_norm_gelu_4096x768 --trials 1000 --time-budget "$ln" \
    --compile --database "$out/gpu.db" --json "$out/gpu.jsonl" 2>&1 | tee -a "$out/tune.log"
timeout 100 python3 benchmarks/gpu_sanitize.py --per-sketch 2 2>&1 | tee "$out/sanitize.log"
date -u
