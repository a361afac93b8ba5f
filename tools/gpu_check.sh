#!/usr/bin/env bash
# The prepared GPU check: engine tests on CUDA, the benchmark on CUDA and the decode step against its
# bandwidth and launch floors, written to ONE JSON (default lib/servelab/data/engine_bench_gpu.json).
# At most 8 minutes on one GPU. The code is tools/gpu_check.py; this script only calls it.
#
#   tools/gpu_check.sh                      # on a CUDA machine
#   tools/gpu_check.sh --out PATH           # somewhere else
#   tools/gpu_check.sh --dry-run            # the same code on the CPU, tiny sizes (CI runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD/lib${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec timeout 480 "$PY" tools/gpu_check.py "$@"
