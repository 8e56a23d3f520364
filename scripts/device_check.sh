#!/usr/bin/env bash
# The GPU acceptance check (issues 43 and 44; docs/gpu.md), one script for a machine with one
# CUDA device, under 10 minutes: the torch version and GPU name first, then one summary line
# per check: the `gpu` tests (tests/test_gpu.py and the CUDA test of tests/test_model.py), the
# matched arms' throughput per attention backend (benchmarks/bench_gpu.py, flex and SDPA,
# compiled), the peer benchmark against HF Llama (benchmarks/bench_peer_gpu.py) and the
# demo SAN's sweep as members against solo runs (benchmarks/bench_members.py --device cuda). Logs
# go to $OUT (default /tmp/sanlab-device). Uses the machine's own python3 ($PYTHON) and
# torch; sanlab runs from src/ without installing (pydantic from .whl/ if the image lacks it).
#
#   bash scripts/device_check.sh             # on the GPU machine
#   DRY_RUN=1 bash scripts/device_check.sh   # here, on the CPU: every step at tiny shapes (the
#                                            # script and the tests checked, not a GPU)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sanlab-device}
DRY=${DRY_RUN:-0}
# the machine's python3 on the GPU machine; for the dry run here, the project's .venv where there is one
if [ "$DRY" = 1 ] && [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
"$PY" -c "import torch, sanlab; print('torch', torch.__version__, '| GPU', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none (CPU)')" | tee "$OUT/summary.txt"
failed=0

# check NAME SECONDS CMD...: run CMD under a time limit into $OUT/NAME.log; one summary line
check() {
  local name=$1 limit=$2 start rc status
  shift 2
  start=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  case $rc in 0) status=pass ;; 124) status="TIMEOUT after ${limit}s" ;; *) status="FAIL (exit $rc)" ;; esac
  [ "$rc" -eq 0 ] || failed=1
  printf '%-12s %-22s %4ss  %s\n' "$name" "$status" "$(($(date +%s) - start))" \
    "$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-100)" | tee -a "$OUT/summary.txt"
}

if [ "$DRY" = 1 ]; then
  # the CPU stand-in: the gpu tests collected, the fastest of them run on the CPU
  # (SANLAB_DEVICE_CHECK_DRY=1), the benchmarks at tiny shapes
  check gpu-collect 120 "$PY" -m pytest -q -m gpu -p no:cacheprovider --collect-only tests/test_gpu.py tests/test_model.py
  check gpu-tests 240 env SANLAB_DEVICE_CHECK_DRY=1 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py \
    -k "softmax-uniform or short_and_odd_lengths_give_each_document_its_own_logits and eager or members or batched_greedy"
  check bench-gpu 120 "$PY" benchmarks/bench_gpu.py --device cpu --tiny --backends sdpa --no-compile
  check bench-peer 120 "$PY" benchmarks/bench_peer_gpu.py --device cpu --tiny
  check members 120 "$PY" benchmarks/bench_members.py --device cpu --shapes demo --members 2 --partner-members 0 \
    --steps 1 --warmup 1
else
  check gpu-tests 300 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_model.py
  # the paper's base SAN and its partners, FlexAttention (block mask) and SDPA, compiled
  check bench-gpu 120 "$PY" benchmarks/bench_gpu.py --backends flex,sdpa --steps 5 --warmup 2
  check bench-peer 60 "$PY" benchmarks/bench_peer_gpu.py
  # the demo SAN's sweep (5L d64 T128) as members (eager) against solo runs (compiled), M 1 / 8 / 16
  check members 120 "$PY" benchmarks/bench_members.py --device cuda --shapes demo --members 1,8,16 \
    --partner-members 0 --steps 6 --warmup 2
fi
exit "$failed"
