#!/usr/bin/env bash
# The main job end to end on real bundled data: 5,000 MNIST digits -> TFRecords -> a brief training.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/env.sh
. .venv/bin/activate
export TF_CPP_MIN_LOG_LEVEL=2
rm -rf demo && mkdir -p demo
python -m beam_etl.demo demo/mnist
beam-etl convert --input demo/mnist --output demo/dataset --channels 1 --image_format png --validation_fraction 0.1 --num_shards train=4,validation=2
# Digits: no flips, gentle crops.
trainer train --data_dir demo/dataset --job_dir demo/job --model small_cnn --image_size 28 --epochs 6 --batch_size 64 \
    --min_crop_area 0.8 --no_flip --central_fraction 1.0
