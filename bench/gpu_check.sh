#!/usr/bin/env bash
# Issue 6's GPU check in one script, sized for 8 minutes on one GPU (about 2 min of set-up and
# conversion, about 5 min of measuring). Run from the repository root on a GPU machine:
#     bash bench/gpu_check.sh [WORKDIR]
# It needs this repo's environment with a CUDA build of TensorFlow:
#     bash scripts/env.sh && .venv/bin/pip install -c constraints.txt 'tensorflow[and-cuda]==2.21.0'
# and prints the table that docs/BENCHMARKS.md records. Never needed for CI.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/gpu_check}
PY=${PYTHON:-.venv/bin/python}
export TF_CPP_MIN_LOG_LEVEL=2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
mkdir -p "$WORK"
# 5,000 real-sized photos (~400x350 JPEGs, 80 KB), converted with default options.
[ -d "$WORK/photos" ] || "$PY" bench/make_photos.py "$WORK/photos" --count 5000
[ -f "$WORK/dataset/dataset.json" ] || "$PY" -m beam_etl convert --input "$WORK/photos" --output "$WORK/dataset" --num_shards 16 --progress none
# fp32, then mixed precision (what a tensor-core GPU trains with): the faster the model, the more the input shows.
timeout 200 "$PY" bench/gpu_check.py --data_dir "$WORK/dataset" --steps 60
timeout 200 "$PY" bench/gpu_check.py --data_dir "$WORK/dataset" --steps 60 --mixed_precision
