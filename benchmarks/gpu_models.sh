#!/bin/bash
# Whole models on a CUDA GPU and the bf16 Tensor Core GEMM, for a lent machine with an NVIDIA GPU,
# CuPy and PyTorch; each stage under its own time limit; logs, JSON lines and records go to $1.
#   bash benchmarks/gpu_models.sh results/ [seconds of fp16 ResNet-18 tuning] [0: skip float32]   # about 8 minutes
out=${1:-gpu-results}; budget=${2:-140}; float32=${3:-1}
source "$(dirname "$0")/gpu_env.sh"  # env.txt and the CUDA tests
# ResNet-18 in float16, tuned from a fresh database for $budget seconds, against eager and inductor
timeout $((budget + 170)) python3 benchmarks/gpu_model.py --dtype float16 --time-budget "$budget" \
    --database "$out/r18_half.db" --out "$out" 2>&1 | grep -v Warning | tee "$out/r18_half.log"
# ResNet-18 in float32 on default schedules: the whole-model driver's answer on a GPU
[ "$float32" = 0 ] || timeout 100 python3 benchmarks/gpu_model.py --dtype float32 --no-inductor --rounds 3 \
    --out "$out" 2>&1 | grep -v Warning | tee "$out/r18_float.log"
# bf16 GEMM 4096^3 through the Tensor Core template
timeout 130 python3 benchmarks/gpu_tensorcore.py --size 4096 --dtypes bfloat16 --trials 150 --minutes 0.9 \
    --arch sm_90 --database "$out/tc.db" --out "$out" 2>&1 | tee "$out/bf16.log"
python3 -m ansor export "$out/records.jsonl" --database "$out/r18_half.db" 2>&1 | tail -1
python3 -m ansor export "$out/tc_records.jsonl" --database "$out/tc.db" 2>&1 | tail -1
date -u
