"""The main job: the whole of bertkit on a fresh machine in one command (`make demo` = `bertkit demo --out runs/demo`).

    data       BBC News (2,225 articles), split by article 80/10/10: train -> corpus, test -> held-out text
    vocab      a WordPiece vocabulary trained on the train corpus
    shards     pre-training shards: train (dynamic masks) + held-out (static masks, for a stable accuracy)
    pretrain   a `mini` BERT from scratch: `bertkit pretrain --budget 12m` with the recipe the budget plans
    fillmask   fill-mask examples and the joint-vs-independent exact match on held-out sentences
    attention  the "he -> Bert" attention picture of the book, on MiniLM-L6 and on our model
    sentiment  fine-tune MiniLM-L6 on Rotten Tomatoes sentiment, evaluate on the test split
    report     runs/demo/report.md with every figure and the PNGs

Every stage writes OUT/<stage>/ and a `done.json` last; a stage whose done.json exists is reused (an interrupted
demo resumes where it stopped) unless --force. Its time and what the pre-training budget buys: docs/cli.md.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from bertkit import datasets, plots
from bertkit.atomic import write_text
from bertkit.commands.pretrain import config_from_argv
from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.progress import say

__all__ = ["DemoConfig", "run_demo", "STAGES"]

STAGES = ("data", "vocab", "shards", "pretrain", "fillmask", "attention", "sentiment", "report")

HE_SENTENCE = ("Bert notices the hat, but chooses not to engage Ernie since he knows it'll lead to some "
               "ridiculous stuff.")

FILL_EXAMPLES = [
    "The prime [MASK] said the government would act.",
    "Shares in the company [MASK] sharply on Monday.",
    "The film won the award for best [MASK].",
    "Chelsea beat Arsenal in the [MASK] on Saturday.",
    "The new phone will go on sale in [MASK].",
    "Mr Blair told the [MASK] [MASK] that the election would be held in May.",
    "The [MASK] [MASK] rose by 2% in the last quarter.",
    "He scored two [MASK] in the [MASK] half.",
]


# the stages import torch / numpy where they run: `bertkit -h` reads DemoConfig and STAGES
@dataclass
class DemoConfig:
    out: str = "runs/demo"
    seed: int = 0
    force: bool = False
    only: tuple[str, ...] = ()            # run just these stages (their inputs must exist)
    # vocab: 8k pieces suit a 1M-word corpus (bert-base's 30k would leave most pieces rarely seen)
    vocab_size: int = 8192
    # pre-training: `bertkit pretrain --budget` from scratch, every other setting the budget's plan
    # (bertkit.train.recipe), on the shards the plan is measured on (recipe.SHARDS: sentence-pair rows of 64)
    preset: str = "mini"
    pretrain_budget_s: float = 720.0      # wall clock for the optimizer loop
    fill_eval_sentences: int = 60
    sentiment_epochs: float = 1.0
    sentiment_train_examples: int | None = 4000   # a quick run; None = all ~8.3k training sentences
    sentiment_lr: float = 1e-4            # one short epoch: the top of the usual range for a 6-layer model
    progress: bool = True


def _done(path: Path) -> dict | None:
    try:
        return json.loads((path / "done.json").read_text())
    except (OSError, ValueError):      # not there yet, or half-written
        return None


# ------------------------------------------------------------------------------------------------- stages

def stage_data(cfg: DemoConfig, out: Path) -> dict:
    parts = dict(zip(("train", "dev", "test"), datasets.split_by_seed(datasets.bbc_articles(), seed=cfg.seed)))
    out.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
        datasets.write_corpus(part, out / f"bbc_{name}.txt")
    return {"articles": {n: len(part) for n, part in parts.items()},
            "bytes": {n: (out / f"bbc_{n}.txt").stat().st_size for n in parts}}


def stage_vocab(cfg: DemoConfig, out: Path, data: Path) -> dict:
    from bertkit.vocab import train_vocab  # deferred: torch / numpy
    tok = train_vocab([str(data / "bbc_train.txt")], vocab_size=cfg.vocab_size, lowercase=True, progress=cfg.progress)
    tok.save(out)
    return {"vocab_size": tok.vocab_size, "vocab_hash": tok.vocab_hash,
            "example": tok.tokenize("The chancellor's pre-budget report disappointed economists.")}


def stage_shards(cfg: DemoConfig, out: Path, data: Path, vocab: Path) -> dict:
    from bertkit.pretraining import PrepareConfig, prepare  # deferred: torch / numpy
    from bertkit.train.recipe import SHARDS
    res = {}
    # held out: whole-word 15% static masks, BERT's evaluation and a fixed yardstick
    for split, masks in (("train", SHARDS), ("heldout", {**SHARDS, "masking": "wwm", "mask_prob": 0.15,
                                                         "dynamic": False})):
        src = data / ("bbc_train.txt" if split == "train" else "bbc_test.txt")
        s = prepare(PrepareConfig(str(src), str(vocab / "vocab.txt"), out / split, **masks,
                                  seed=cfg.seed + (0 if masks["dynamic"] else 1), overwrite=True,
                                  progress=cfg.progress))
        m = json.loads((out / split / "manifest.json").read_text())
        res[split] = {"examples": m["counts"]["examples"], "tokens": m["counts"]["tokens"], "seconds": s.seconds,
                      **{k: masks[k] for k in ("seq_len", "task", "masking", "mask_prob")}}
    return res


def stage_pretrain(cfg: DemoConfig, out: Path, vocab: Path, shards: Path) -> dict:
    """`bertkit pretrain TRAIN --preset mini --budget 12m --eval-shards HELDOUT` with its defaults: the budget's plan
    (out/plan.json), out/model, metrics.jsonl, curves.png, summary.md."""
    import torch  # deferred: torch / numpy
    from bertkit.heads import BertForMaskedLM, BertForPreTraining
    from bertkit.precision import resolve
    from bertkit.pretraining.shards import read_manifest
    from bertkit.train.pretrain import pretrain
    from bertkit.train.recipe import SHARDS
    built = read_manifest(shards / "train")
    if (built["task"], int(built["seq_len"])) != (SHARDS["task"], SHARDS["seq_len"]):
        raise BertkitError(f"{shards / 'train'} holds task {built['task']!r} rows of {built['seq_len']} tokens (an "
                           f"older demo's), this demo pre-trains on task {SHARDS['task']!r} rows of "
                           f"{SHARDS['seq_len']}: re-run with --force (or --only shards,pretrain,fillmask,attention "
                           "--force)")
    shutil.rmtree(out / "run", ignore_errors=True)   # an older demo's run directory
    argv = [str(shards / "train"), "--preset", cfg.preset, "--budget", f"{cfg.pretrain_budget_s:g}s",
            "--eval-shards", str(shards / "heldout"), "--out", str(out), "--vocab", str(vocab / "vocab.txt"),
            "--seed", str(cfg.seed), "--keep", "1", "--overwrite", "--log-every", "5",
            *([] if cfg.progress else ["--no-progress"])]
    say(f"[demo] bertkit pretrain {' '.join(argv)}  ({torch.get_num_threads()} threads)")
    result = pretrain(config_from_argv(argv))
    shutil.rmtree(out / "checkpoints", ignore_errors=True)   # optimizer state for --resume: not needed here
    final = dict(result.eval_history[-1]) if result.eval_history else {}
    task = built["task"]
    cls = BertForPreTraining if task != "none" else BertForMaskedLM
    with torch.device("meta"):                      # the trained class's size, without reading its weights back
        n_params = cls(BertConfig.from_json(out / "model" / "config.json")).num_parameters()
    train_acc = [h.get("mlm_acc") for h in result.history if h.get("mlm_acc") is not None]
    plan = json.loads((out / "plan.json").read_text())
    return {"steps": result.steps, "tokens": result.tokens, "seconds": result.elapsed_s,
            "tokens_per_s": result.tokens / max(result.elapsed_s, 1e-9), "params": n_params,
            "precision": resolve("auto", "cpu"),        # what the default --precision auto ran
            "final_train_loss": float(sum(result.losses[-20:]) / max(len(result.losses[-20:]), 1)),
            "final_train_mlm_acc": train_acc[-1] if train_acc else None,
            # MLM only: the loss is the MLM loss
            "heldout_mlm_acc": final.get("mlm_acc"), "heldout_mlm_loss": final.get("mlm_loss", final.get("loss")),
            "heldout_nsp_acc": final.get("nsp_acc"),
            "heldout_masked_tokens": final.get("masked_tokens"),
            "heldout_curve": [{"step": h.get("step"), "mlm_acc": h.get("mlm_acc"), "nsp_acc": h.get("nsp_acc")}
                              for h in result.eval_history],
            "model_dir": str(out / "model"), "stop_reason": result.stop_reason,
            "recipe": {"preset": cfg.preset, "task": task, **plan["settings"],
                       "estimated_steps": plan["estimated_steps"]}}


def stage_fillmask(cfg: DemoConfig, out: Path, model_dir: Path, data: Path) -> dict:
    from bertkit.fillmask_eval import MultiMaskOptions, multi_mask_eval  # deferred: torch / numpy
    from bertkit.infer import Predictor
    from bertkit.pretraining import split_sentences
    p = Predictor.load(model_dir)
    examples = [{"text": text, **p.fill_mask(text, top_k=5)} for text in FILL_EXAMPLES]
    # held-out sentences (test articles: never seen in pre-training)
    sents = [s for para in (data / "bbc_test.txt").read_text(encoding="utf-8").splitlines()
             for s in split_sentences(para) if 8 <= len(s.split()) <= 40]
    evals = {span: multi_mask_eval(p, sents, MultiMaskOptions(span=span, limit=cfg.fill_eval_sentences,
                                                              seed=cfg.seed, progress=cfg.progress))
             for span in ("contiguous", "scattered")}
    return {"examples": examples, "multi_mask": evals}


def stage_attention(cfg: DemoConfig, out: Path, model_dir: Path) -> dict:
    from bertkit.infer import Predictor  # deferred: torch / numpy
    res = {}
    for name, path in (("minilm", datasets.minilm_dir()), ("ours", model_dir)):
        p = Predictor.load(path)
        tokens, att = p.attention(HE_SENTENCE)
        with plots.optional():          # without matplotlib the numbers stay, the pictures are skipped
            plots.plot_attention(att, tokens, out / f"attention_grid_{name}.png",
                                 title=f"{name}: attention per layer and head")
            plots.plot_attention_from(att, tokens, "he", out / f"attention_he_{name}.png",
                                      title=f"{name}: where 'he' looks, per layer.head")
        q = tokens.index("he")
        bert = [1]                      # "Bert" opens the sentence; a vocab may split it ("be ##rt"): sum its pieces
        continues = p.tokenizer.continues_word(p.tokenizer.convert_tokens_to_ids(tokens))
        while continues[bert[-1] + 1]:
            bert.append(bert[-1] + 1)
        best = max(((li, hi, float(a[hi, q, bert].sum())) for li, a in enumerate(att) for hi in range(a.shape[0])),
                   key=lambda x: x[2])
        res[name] = {"best_head": f"L{best[0]}.H{best[1]}", "he_to_bert": best[2],
                     "grid": f"attention_grid_{name}.png", "he": f"attention_he_{name}.png"}
    return res


def stage_sentiment(cfg: DemoConfig, out: Path) -> dict:
    from bertkit.infer import Predictor  # deferred: torch / numpy
    from bertkit.tasks.data import build
    from bertkit.tasks.metrics import confusion_matrix
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    stats = build("sentiment", out / "data", seed=cfg.seed)
    files = stats["files"]
    fcfg = FinetuneConfig(task="classify", model=str(datasets.minilm_dir()), train=files["train"], dev=files["dev"],
                          test=files["test"], out=str(out / "model"),
                          training=finetune_recipe(epochs=cfg.sentiment_epochs, lr=cfg.sentiment_lr), batch_size=32,
                          max_train_examples=cfg.sentiment_train_examples, seeds=(cfg.seed + 1,),
                          quiet=not cfg.progress)
    summary = finetune(fcfg)
    # our own pass over the test split through the inference API: the confusion matrix and a cross-check
    with open(files["test"], encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    pred = Predictor.load(out / "model")
    labels = pred.labels or ["neg", "pos"]
    got = [r["label"] for r in pred.classify([r["text"] for r in rows], max_length=128, batch_size=128)]
    ix = {l: i for i, l in enumerate(labels)}
    m = confusion_matrix([ix[r["label"]] for r in rows], [ix[g] for g in got], len(labels))
    acc = sum(int(r["label"] == g) for r, g in zip(rows, got)) / len(rows)
    with plots.optional():
        plots.plot_confusion(m, labels, out / "confusion_test.png",
                             title=f"sentiment, test split (n={len(rows)}, accuracy {acc:.3f})")
    curves = None
    for metrics in sorted((out / "model").rglob("metrics.jsonl")):
        try:
            curves = plots.plot_run(metrics.parent, out / "curves.png", title="sentiment fine-tuning")
            break
        except plots.PlotsMissing:
            break
        except BertkitError:
            continue
    return {"data": stats.get("counts"), "test": summary.get("test", {}), "dev": summary.get("dev"),
            "test_accuracy_inference_api": acc, "confusion": m.tolist(), "labels": labels,
            "examples_per_s": summary.get("examples_per_s"), "curves": bool(curves),
            "train_examples": cfg.sentiment_train_examples, "epochs": cfg.sentiment_epochs}


# ------------------------------------------------------------------------------------------------- report

def _fmt(x, nd=3):
    if isinstance(x, dict) and "mean" in x:
        x = x["mean"]
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def write_report(cfg: DemoConfig, out: Path, results: dict) -> Path:
    """OUT/report.md: the machine, the stage table, then a section per stage that has results."""
    lines = _header_section(cfg) + _stages_section(results)
    for stage, section in _SECTIONS:
        info = results.get(stage) or {}
        if info:
            lines += section(cfg, info)
    return write_text(out / "report.md", "\n".join(lines) + "\n")


def _header_section(cfg: DemoConfig) -> list[str]:
    import torch
    from bertkit.hardware import usable_cpus  # deferred: hardware imports torch, kept off `bertkit -h`'s path
    return [f"# bertkit demo report", "",
            f"Machine: {platform.machine()}, {usable_cpus()} CPU cores, torch threads {torch.get_num_threads()}; "
            f"seed {cfg.seed}; load average at report time {_load()}. "
            f"Generated by `python -m bertkit demo --out {cfg.out}`.", ""]


def _stages_section(results: dict) -> list[str]:
    lines = ["## Stages", "", "| stage | seconds | status |", "|---|---:|---|"]
    total = 0.0
    for st in STAGES[:-1]:
        info = results.get(st) or {}
        sec = info.get("_seconds")
        total += sec or 0.0
        lines.append(f"| {st} | {_fmt(sec, 1) if sec is not None else '-'} | {info.get('_status', 'not run')} |")
    return lines + [f"| **total** | {total:.1f} | |", ""]


def _data_section(cfg: DemoConfig, d: dict) -> list[str]:
    return ["## Data", "", f"BBC News split by article (seed {cfg.seed}): {d['articles']} articles; "
            f"pre-training text {d['bytes']['train'] / 1e6:.1f} MB, held-out (test articles) "
            f"{d['bytes']['test'] / 1e6:.2f} MB.", ""]


def _vocab_section(cfg: DemoConfig, v: dict) -> list[str]:
    return ["## Vocabulary", "", f"WordPiece, {v['vocab_size']} entries, trained on the training articles. "
            f"Example: `{' '.join(v['example'])}`", ""]


def _shards_section(cfg: DemoConfig, s: dict) -> list[str]:
    def row(split: str, how: str) -> str:
        d = s[split]                     # older done.json files lack masking / mask_prob (whole-word 15%)
        mode = {"wwm": "whole-word"}.get(d.get("masking", "wwm"), d.get("masking"))
        name = {"heldout": "held-out"}.get(split, split)
        return f"| {name} | {d['examples']} | {d['tokens']} | {mode} {d.get('mask_prob', 0.15):.0%}, {how} |"
    return ["## Pre-training data", "", f"| split | rows ({s['train'].get('seq_len', 128)} tokens) | tokens | "
            "masking |", "|---|---:|---:|---|", row("train", "dynamic (redrawn per epoch)"),
            row("heldout", "static"), ""]


def _pretrain_section(cfg: DemoConfig, p: dict) -> list[str]:
    r = p.get("recipe") or {}
    objective = "MLM only" if r.get("task", "none") == "none" else f"MLM + {r['task'].upper()}"
    lines = [f"## Pre-training (`{r.get('preset', 'mini')}`, {objective}, from scratch)", ""]
    if r:
        decay = f" (decay over the last {r['decay_fraction']:.0%})" if r["schedule"] == "wsd" else ""
        unit = "steps" if r["warmup"] >= 1 else "of the steps"
        masks = (f"token masks {r['mask_prob']:.0%} redrawn every epoch, " if r.get("masking") == "token" else "")
        lines.append(f"- the budget's plan (pretrain/plan.json): {masks}batch {r['batch_size']}, lr {r['lr']:g}, "
                     f"warmup {r['warmup']:g} {unit}, schedule {r['schedule']}{decay}, dropout {r['dropout']:g}"
                     + (f"; ~{r['estimated_steps']:,} steps estimated" if r.get("estimated_steps") else ""))
    lines += [f"- {p['steps']} optimizer steps in {p['seconds']:.0f} s, {p['tokens'] / 1e6:.2f} M tokens "
              f"({p['tokens_per_s']:.0f} tokens/s), {p['params'] / 1e6:.1f} M parameters, "
              f"{'bf16 autocast' if p.get('precision', 'bf16') == 'bf16' else 'fp32 (no native bf16 on this CPU)'}",
              f"- final training loss {p['final_train_loss']:.3f}, "
              f"training MLM accuracy {_fmt(p['final_train_mlm_acc'])}",
              f"- **held-out MLM accuracy {p['heldout_mlm_acc']:.3f}** (loss {_fmt(p.get('heldout_mlm_loss'))}) on "
              f"{int(p['heldout_masked_tokens'])} masked tokens of unseen BBC articles"
              + (f"; held-out {r.get('task', 'nsp').upper()} accuracy {p['heldout_nsp_acc']:.3f}"
                 if p.get("heldout_nsp_acc") is not None else "")]
    if p.get("heldout_curve"):
        lines.append("- held-out MLM accuracy by step: " + ", ".join(
            f"{h['step']}: {h['mlm_acc']:.3f}" for h in p["heldout_curve"] if h.get("mlm_acc") is not None))
    return lines + ["", "![pre-training curves](pretrain/curves.png)", ""]


def _fillmask_section(cfg: DemoConfig, f: dict) -> list[str]:
    lines = ["## Fill-mask (our pre-trained `mini`)", ""]
    for ex in f["examples"]:
        c = ex["candidates"]
        if ex["masks"] == 1:
            got = ", ".join(f"{x['word']} ({x['score']:.2f})" for x in c)
        else:
            got = "; ".join(f"{' '.join(x['tokens'])} ({x['score']:.2g})" for x in c[:3])
        lines.append(f"- `{ex['text']}` -> {got}")
    lines += ["", "Several masks, jointly (beam search + pseudo-likelihood re-ranking) vs each mask's independent "
              "argmax, on held-out sentences with 2-3 masked one-piece words:", "",
              "| masked words | sentences | exact match, joint | exact match, independent | per-mask, joint | per-mask, independent |",
              "|---|---:|---:|---:|---:|---:|"]
    for span, e in f["multi_mask"].items():
        lines.append(f"| {span} | {e['sentences']} | **{e['joint_exact']:.3f}** | {e['independent_exact']:.3f} | "
                     f"{e['joint_per_mask']:.3f} | {e['independent_per_mask']:.3f} |")
    ex = (f["multi_mask"].get("contiguous") or {}).get("examples") or []
    if ex:
        lines += ["", "Where they differ (truth / joint / independent):", ""]
        for e in ex[:5]:
            lines.append(f"- `{e['masked']}`: {' '.join(e['truth'])} / {' '.join(e['joint'])} / {' '.join(e['independent'])}")
    return lines + [""]


def _attention_section(cfg: DemoConfig, a: dict) -> list[str]:
    return ["## Attention: where does \"he\" look?", "",
            f"`{HE_SENTENCE}`", "",
            f"MiniLM-L6: the head most focused on \"bert\" from \"he\" is {a['minilm']['best_head']} "
            f"(weight {a['minilm']['he_to_bert']:.2f}); our mini model: {a['ours']['best_head']} "
            f"(weight {a['ours']['he_to_bert']:.2f}).", "",
            "![he, MiniLM](attention/attention_he_minilm.png)", "",
            "![grid, MiniLM](attention/attention_grid_minilm.png)", "",
            "![he, ours](attention/attention_he_ours.png)", ""]


def _sentiment_section(cfg: DemoConfig, se: dict) -> list[str]:
    t = se.get("test") or {}
    lines = ["## Sentiment (MiniLM-L6 fine-tuned on Rotten Tomatoes)", "",
             f"- data: {se.get('data')}; trained on {se.get('train_examples') or 'all'} sentences for "
             f"{se.get('epochs')} epoch(s)",
             f"- **test accuracy {_fmt(t.get('accuracy'))}**, macro-F1 {_fmt(t.get('f1_macro'))} "
             f"(bertkit.tasks); through the inference API: {se['test_accuracy_inference_api']:.3f}",
             "", "![confusion](sentiment/confusion_test.png)", ""]
    if se.get("curves"):
        lines += ["![fine-tuning curves](sentiment/curves.png)", ""]
    return lines


# the report's sections after the stage table, in order: (stage whose results it shows, builder)
_SECTIONS = (("data", _data_section), ("vocab", _vocab_section), ("shards", _shards_section),
             ("pretrain", _pretrain_section), ("fillmask", _fillmask_section), ("attention", _attention_section),
             ("sentiment", _sentiment_section))


def _load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"
    except OSError:
        return "unknown"


# ------------------------------------------------------------------------------------------------- driver

def run_demo(cfg: DemoConfig) -> Path:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    dirs = {s: out / s for s in STAGES}
    unknown = set(cfg.only) - set(STAGES)
    if unknown:
        raise BertkitError(f"--only: unknown stage(s) {sorted(unknown)}; stages: {', '.join(STAGES)}")
    fns = {
        "data": lambda: stage_data(cfg, dirs["data"]),
        "vocab": lambda: stage_vocab(cfg, dirs["vocab"], dirs["data"]),
        "shards": lambda: stage_shards(cfg, dirs["shards"], dirs["data"], dirs["vocab"]),
        "pretrain": lambda: stage_pretrain(cfg, dirs["pretrain"], dirs["vocab"], dirs["shards"]),
        "fillmask": lambda: stage_fillmask(cfg, dirs["fillmask"], dirs["pretrain"] / "model", dirs["data"]),
        "attention": lambda: stage_attention(cfg, dirs["attention"], dirs["pretrain"] / "model"),
        "sentiment": lambda: stage_sentiment(cfg, dirs["sentiment"]),
    }
    results: dict[str, dict] = {}
    t_all = time.perf_counter()
    for st in STAGES[:-1]:
        prev = _done(dirs[st])
        if cfg.only and st not in cfg.only:
            if prev:
                results[st] = {**prev, "_status": "reused"}
            continue
        if prev and not cfg.force:
            say(f"[demo] {st}: reusing {dirs[st]} (done in {prev.get('_seconds', 0):.0f} s earlier; --force to redo)")
            results[st] = {**prev, "_status": "reused"}
            continue
        say(f"[demo] {st}: running")
        t0 = time.perf_counter()
        info = fns[st]()
        info["_seconds"] = time.perf_counter() - t0
        dirs[st].mkdir(parents=True, exist_ok=True)
        write_text(dirs[st] / "done.json", json.dumps(info, indent=1, default=str) + "\n")
        results[st] = {**info, "_status": "ran"}
        say(f"[demo] {st}: done in {info['_seconds']:.1f} s")
    report = write_report(cfg, out, results)
    say(f"[demo] report: {report}  (this invocation: {time.perf_counter() - t_all:.0f} s)")
    return report

