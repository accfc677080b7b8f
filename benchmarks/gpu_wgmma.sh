#!/bin/bash
# Hopper's wgmma GEMM template on a lent GPU: chosen programs checked and timed against cuBLAS,
# then float16 and bfloat16 GEMM 4096^3 searches; stops after the check if no program is right.
#   bash benchmarks/gpu_wgmma.sh results/ [float16 seconds] [bfloat16 seconds]     # about 8 minutes
out=${1:-gpu-results}; fp16=${2:-150}; bf16=${3:-90}
source "$(dirname "$0")/gpu_env.sh"  # env.txt and the CUDA tests
timeout 240 python3 benchmarks/gpu_wgmma.py --out "$out" 2>&1 | grep -v Warning | tee "$out/wgmma.log"
grep -q "x$" "$out/wgmma.log" || { echo "no wgmma program computed the product: stopping"; date -u; exit 1; }
timeout $((fp16 + 150)) python3 benchmarks/gpu_tensorcore.py --size 4096 --dtypes float16 --trials 1000 \
    --minutes "$(python3 -c "print($fp16 / 60)")" --arch sm_90 --database /tmp/ansor-wgmma-tc.db --out "$out" 2>&1 | tee "$out/fp16.log"
timeout $((bf16 + 120)) python3 benchmarks/gpu_tensorcore.py --size 4096 --dtypes bfloat16 --trials 1000 \
    --minutes "$(python3 -c "print($bf16 / 60)")" --arch sm_90 --database /tmp/ansor-wgmma-tc.db --out "$out" 2>&1 | tee "$out/bf16.log"
python3 -m ansor export "$out/tc_records.jsonl" --database /tmp/ansor-wgmma-tc.db 2>&1 | tail -1
date -u
