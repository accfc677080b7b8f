# Sourced by the GPU scripts once they have set $out: the package importable from the checkout,
# the machine, the commit and the Python packages written to $out/env.txt, then the CUDA tests
# (their last lines in $out/cuda_tests.log). xgboost must be importable (the cost model); where
# it is not installed, carry its wheel.
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
{ date -u; git log --oneline -1 2>/dev/null; nvidia-smi -L; nvcc --version | tail -1
  python3 -c "import cupy, torch, xgboost; print('cupy', cupy.__version__, 'torch', torch.__version__, 'xgboost', xgboost.__version__)"
  lscpu | grep 'Model name'; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_gpu.py 2>&1 | tail -3 | tee "$out/cuda_tests.log"
