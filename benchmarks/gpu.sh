#!/usr/bin/env bash
# CUDA checks and the benchmark table on one CUDA GPU, in at most 5 minutes.
#   bash benchmarks/gpu.sh [OUT_DIR]      (default benchmarks/results/gpu)
# Writes OUT_DIR/gpu.txt (everything printed) and OUT_DIR/gpu.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-benchmarks/results/gpu}
mkdir -p "$out"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 1
  echo "== CUDA correctness tests"
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_player.py -k "cuda or device"
  tests=$?
  echo "== benchmark table"
  timeout 170 python3 -m benchmarks.gpu --out "$out"
  bench=$?
  echo "tests exit $tests, benchmark exit $bench"
  [ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
} 2>&1 | tee "$out/gpu.txt"
exit "${PIPESTATUS[0]}"
