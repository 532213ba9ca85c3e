#!/usr/bin/env bash
# The GPU suite (benchmarks/gpu_suite.py): bertkit against transformers on one GPU, one JSON line per figure, under
# 8 minutes on an H100 / H200. Arguments go to gpu_suite.py (--quick, --device cpu for a dry run, --peak-tflops N
# for a GPU the peak table lacks, --budget-s, --skip, --families).
#
#   bash benchmarks/gpu_suite.sh | tee gpu_suite.jsonl
#   bash benchmarks/gpu_suite.sh --device cpu --quick      # the same code, tiny shapes, on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
# the project's virtualenv where there is one, else the machine's python (a GPU image's, with torch in it)
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" benchmarks/gpu_suite.py "$@"
