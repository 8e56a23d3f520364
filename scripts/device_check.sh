#!/usr/bin/env bash
# The GPU check, as one short script for a machine with a CUDA device (see docs/gpu.md):
# the `gpu` tests (FlexAttention vs SDPA, CUDA vs CPU, bf16 training and resume) and the
# matched-arm throughput benchmark. Results go to $OUT (or /tmp/sanlab-device).
# Uses the machine's own python3 + torch; sanlab runs from src/ without installing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sanlab-device}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, sanlab; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_model.py 2>&1 | tee "$OUT/gpu_tests.log"
tests=${PIPESTATUS[0]}
# the paper's base SAN and its partners, FlexAttention with the document block mask, compiled
timeout 300 python3 benchmarks/bench_gpu.py --backends flex 2>&1 | tee "$OUT/bench_gpu.txt"
exit "$tests"
