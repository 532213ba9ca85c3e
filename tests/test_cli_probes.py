"""The command-line campaign: a careless or hostile user's mistakes, for every subcommand, as a table of probes.

Every probe must end in exit 2 with one line on stderr (`bertkit CMD: error: ...` naming what is wrong), never a
traceback, and must leave every input and every earlier output byte-for-byte as it was (the world directory and the
probe's own scratch directory are hashed before and after). Probes run in-process through `bertkit.cli.main`; an
exception escaping it counts as a traceback. Classes: argument ranges, output paths, inputs (missing, not UTF-8,
binary), model files, attention queries / layers, serve start-up, full disks.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import socket
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bertkit.commands.checks import MARKER, REPLACED

WORDS = "the a man is eating food bread dog run paris france great awful film plot was very".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BINARY = bytes(range(256)) * 4 + b"\n\xff\xfe\x00\x81\n"
LONG_INT = b"1" * 5000                 # past Python's int-parsing digit limit: json raises a bare ValueError
LATIN1 = "text,label\nthe film was great,pos\ncaf\xe9 was awful,neg\n".encode("latin-1")


@dataclass
class Probe:
    name: str
    argv: list            # strings; "W/..." is the world directory, "T/..." the probe's scratch directory
    match: str            # a substring the error line must contain (case-insensitive)
    setup: dict = field(default_factory=dict)   # scratch files: "T/path" -> bytes, or -> {"command": ...} marker


# ------------------------------------------------------------------------------------------------ the world

def _sentiment(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        rows.append({"text": " ".join(rng.sample(WORDS[:12], 4) + [{"pos": "great", "neg": "awful"}[label]]),
                     "label": label})
    return rows


def _models(w: Path) -> None:
    import torch
    from bertkit import BertConfig, BertForMaskedLM, Tokenizer
    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(cfg).save_pretrained(w / "mlm", tokenizer=Tokenizer(vocab))
    (w / "vocab").mkdir()
    shutil.copy(w / "mlm" / "vocab.txt", w / "vocab" / "vocab.txt")
    shutil.copytree(w / "mlm", w / "mlm2")
    for name, change in (("listcfg", lambda c: [c]), ("hugepos", lambda c: {**c, "max_position_embeddings": 10**12})):
        shutil.copytree(w / "mlm", w / name)
        c = json.loads((w / name / "config.json").read_text())
        (w / name / "config.json").write_text(json.dumps(change(c)))


# hostile JSON in a model directory: (file, how it is spoiled), for fill-mask / embed / attention / export / finetune
# (from W/mlm) and evaluate / predict / quantize (from W/clf); each is a one-line refusal naming the file or field
_SPOILED = {
    "cfg-empty": ("config.json", lambda c: b"", "config.json"),
    "cfg-deep": ("config.json", lambda c: b"[" * 200_000 + b"]" * 200_000, "config.json"),
    "cfg-binary": ("config.json", lambda c: BINARY, "config.json"),
    "cfg-string": ("config.json", lambda c: b'"a config"', "config.json"),
    "cfg-nan-eps": ("config.json", lambda c: {**c, "layer_norm_eps": float("nan")}, "layer_norm_eps"),
    "cfg-inf-init": ("config.json", lambda c: {**c, "initializer_range": float("inf")}, "initializer_range"),
    "cfg-evil-attn": ("config.json", lambda c: {**c, "attn_implementation": "evil"}, "attn_implementation"),
    "cfg-str-hidden": ("config.json", lambda c: {**c, "hidden_size": "32"}, "hidden_size"),
    "cfg-neg-vocab": ("config.json", lambda c: {**c, "vocab_size": -1}, "vocab_size"),
    "cfg-bool-layers": ("config.json", lambda c: {**c, "num_hidden_layers": True}, "num_hidden_layers"),
    "cfg-int-arch": ("config.json", lambda c: {**c, "architectures": 7}, "architectures"),
    "cfg-long-int": ("config.json", lambda c: b'{"vocab_size": ' + LONG_INT + b"}", "config.json"),
    "tok-long-int": ("tokenizer_config.json", lambda c: b'{"model_max_length": ' + LONG_INT + b"}",
                     "tokenizer_config.json"),
    "tok-maybe": ("tokenizer_config.json", lambda c: {**c, "do_lower_case": "maybe"}, "do_lower_case"),
    "tok-list": ("tokenizer_config.json", lambda c: [c], "tokenizer_config.json"),
    "tok-deep": ("tokenizer_config.json", lambda c: b"{\"a\":" * 100_000 + b"1" + b"}" * 100_000,
                 "tokenizer_config.json"),
}


def _spoiled(w: Path) -> None:
    for base in ("mlm", "clf"):
        for name, (file, spoil, _) in _SPOILED.items():
            d = w / f"{base}-{name}"
            shutil.copytree(w / base, d)
            got = spoil(json.loads((d / file).read_text()))
            (d / file).write_bytes(got if isinstance(got, bytes) else json.dumps(got).encode())


# hostile JSON in a sentence-transformers directory (W/st) and beside an index (W/index): (file, key path, value)
_ST_SPOILED = {
    "idx-str": ("modules.json", (0, "idx"), "x", "idx"),
    "idx-nan": ("modules.json", (0, "idx"), float("nan"), "idx"),
    "maxlen-nan": ("sentence_bert_config.json", ("max_seq_length",), float("inf"), "max_seq_length"),
    "maxlen-str": ("sentence_bert_config.json", ("max_seq_length",), "128", "max_seq_length"),
    "prompt-list": ("config_sentence_transformers.json", ("default_prompt_name",), ["query"], "default_prompt_name"),
    "pool-list": ("1_Pooling/config.json", (), [], "1_Pooling"),
    "pool-null": ("1_Pooling/config.json", (), None, "1_Pooling"),
    "tok-no-vocab": ("tokenizer.json", ("model", "vocab"), {}, "tokenizer.json"),
    "tok-cls-list": ("tokenizer_config.json", ("cls_token",), ["[CLS]"], "cls_token"),
    "tok-unk-list": ("tokenizer_config.json", ("unk_token",), [], "unk_token"),
}
_SOURCE_SPOILED = {"list": b"[]", "empty": b"", "null": b"null", "model-list": b'{"model": ["a"]}'}


def _sentence_transformers(w: Path) -> None:
    from bertkit import BertModel, Tokenizer
    from bertkit.embed.pooling import Pooling, SentenceEncoder
    from bertkit.embed.st_format import save_sentence_encoder
    encoder = SentenceEncoder(BertModel.from_pretrained(w / "mlm"), Pooling("mean"), normalize=True, max_seq_length=32)
    save_sentence_encoder(encoder, Tokenizer.from_pretrained(w / "mlm"), w / "st")
    for name, (file, keys, value, _) in _ST_SPOILED.items():
        shutil.copytree(w / "st", w / f"st-{name}")
        data = json.loads((w / f"st-{name}" / file).read_text())
        node = data
        for k in keys[:-1]:
            node = node[k]
        if keys:
            node[keys[-1]] = value
        (w / f"st-{name}" / file).write_text(json.dumps(value if not keys else data))
    shutil.copytree(w / "shards", w / "shards-task-x")
    manifest = json.loads((w / "shards-task-x" / "manifest.json").read_text())
    (w / "shards-task-x" / "manifest.json").write_text(json.dumps({**manifest, "task": "x"}))
    for name, content in _SOURCE_SPOILED.items():
        shutil.copytree(w / "index", w / f"index-source-{name}")
        (w / f"index-source-{name}" / "bertkit_source.json").write_bytes(content)


def _data(w: Path) -> None:
    from bertkit.tasks.readers import write_table
    d = w / "data"
    d.mkdir()
    write_table(d / "train.csv", _sentiment(24, 0))
    write_table(d / "dev.csv", _sentiment(8, 1))
    for name in ("bin.csv", "bin.conll", "bin.json", "bin.txt", "bin.jsonl"):
        (d / name).write_bytes(BINARY)
    (d / "latin.csv").write_bytes(LATIN1)
    (d / "latin.conll").write_bytes("the O\ncaf\xe9 B-LOC\n".encode("latin-1"))
    (d / "latin.json").write_bytes(('{"version": "1.1", "data": [{"title": "caf\xe9"}]}').encode("latin-1"))
    (d / "sents.txt").write_text("the man is eating food\na dog run\n")
    (d / "preds.jsonl").write_text('{"label": "pos", "prediction": "neg"}\n')
    (w / "corpus.txt").write_text(("the man is eating food . the dog run .\nparis france film plot .\n\n") * 40)
    run = w / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "loss": 3.0 - i / 10}) + "\n" for i in range(5)))
    (w / "badrun").mkdir()
    (w / "badrun" / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 2.0}\n\xff\xfe{"step"\n')
    (w / "cfg_bin.json").write_bytes(BINARY)
    (w / "cfg_list.json").write_text("[1, 2]")
    (w / "file.txt").write_text("a plain file\n")
    (w / "loop").symlink_to(w / "loop")
    (w / "nonempty").mkdir()
    (w / "nonempty" / "notes.txt").write_text("someone's notes\n")


def _trained(w: Path) -> None:
    """A classify model (for evaluate / predict) and pre-training shards (for pretrain), via the library."""
    from bertkit.pretraining import PrepareConfig, prepare
    from bertkit.tasks.runner import FinetuneConfig, finetune, finetune_recipe
    d = w / "data"
    finetune(FinetuneConfig(task="classify", model=str(w / "mlm"), train=str(d / "train.csv"), dev=str(d / "dev.csv"),
                            out=str(w / "clf"), batch_size=8, quiet=True,
                            training=finetune_recipe(epochs=1, precision="fp32")))
    prepare(PrepareConfig([str(w / "corpus.txt")], str(w / "vocab" / "vocab.txt"), str(w / "shards"), seq_len=32,
                          progress=False))
    shutil.copytree(Path(__file__).parent / "fixtures" / "tf_bert_tiny", w / "tf")
    _spoiled(w)
    _indexes(w)
    _sentence_transformers(w)


def _indexes(w: Path) -> None:
    """An embedding index of W/data/sents.txt, and copies with one file cut in half."""
    from bertkit.cli import main
    assert main(["embed", str(w / "mlm"), "--file", str(w / "data" / "sents.txt"), "--out", str(w / "index") + "/"]) == 0
    for name in ("vectors.npy", "ids.npy", "manifest.json"):
        d = w / f"index-cut-{name.split('.')[0]}"
        shutil.copytree(w / "index", d)
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[:len(data) // 2])
    for name, texts in _INDEX_TEXTS.items():      # the indexed texts, spoiled
        shutil.copytree(w / "index", w / f"index-texts-{name}")
        (w / f"index-texts-{name}" / "texts.jsonl").write_bytes(texts)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    w = tmp_path_factory.mktemp("world")
    _models(w)
    _data(w)
    _trained(w)
    before = _digest(w)
    yield w
    torch.set_num_threads(threads)
    assert _digest(w) == before, "a test changed the shared inputs"


@pytest.fixture(scope="module")
def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield str(s.getsockname()[1])
    s.close()


# ------------------------------------------------------------------------------------------------ the probes

# (command, argv before the flag) for the range probes: positionals the parser needs before an option
_BASE = {"tokenize": ["tokenize"], "vocab": ["vocab"], "prepare": ["prepare"], "pretrain": ["pretrain", "W/shards"],
         "finetune": ["finetune"], "evaluate": ["evaluate"], "predict": ["predict"], "task-data": ["task-data", "x"],
         "fill-mask": ["fill-mask", "W/mlm", "the [MASK]"], "embed": ["embed", "W/mlm", "x"],
         "attention": ["attention", "W/mlm", "x"], "serve": ["serve", "W/mlm"], "export": ["export", "W/mlm", "o"],
         "demo": ["demo"], "distill": ["distill"]}
POS_INT = ["0", "-3", "abc", "1.5", "\u0663"]          # the last: Arabic-Indic 3, which int() reads
NONNEG_INT = ["-1", "x"]
PROB = ["1.5", "-0.1", "nan"]
POS_FLOAT = ["0", "-1", "inf", "\u0661.\u0665"]        # the last: Arabic-Indic 1.5
NONNEG_FLOAT = ["-0.5", "nan"]
_RANGES = {
    "tokenize": {"--max-length": NONNEG_INT, "--processes": [*POS_INT[:2], "100000"], "--batch-lines": POS_INT[:2]},
    "vocab": {"--vocab-size": POS_INT, "--min-frequency": POS_INT[:2], "--max-distinct-words": POS_INT[:1]},
    "prepare": {"--seq-len": POS_INT, "--mask-prob": PROB, "--dupe-factor": [*POS_INT[:1], "1000000000"],
                "--workers": POS_INT[:2],
                "--short-seq-prob": PROB[:1], "--examples-per-shard": [*POS_INT[:1], "1000000000000"],
                "--max-predictions": ["1000000000"], "--seed": NONNEG_INT[:1]},
    "pretrain": {"--batch-size": POS_INT, "--steps": POS_INT[:2], "--lr": POS_FLOAT, "--dropout": PROB[:2],
                 "--warmup": NONNEG_FLOAT, "--keep": POS_INT[:1], "--epochs": POS_FLOAT[:1],
                 "--global-batch": [*POS_INT[:1], "1000000000"], "--clip": NONNEG_FLOAT[:1],
                 "--save-every": POS_INT[:1],
                 "--phase1-fraction": PROB[:1], "--adam-beta2": PROB[:1], "--device": ["banana", "cuda:7"]},
    "finetune": {"--batch-size": POS_INT, "--lr": POS_FLOAT, "--epochs": POS_FLOAT[:2], "--dropout": PROB,
                 "--max-length": POS_INT[:2], "--doc-stride": POS_INT[:2], "--n-best": POS_INT[:1],
                 "--patience": NONNEG_INT[:1], "--eval-every": POS_INT[:1], "--max-query-length": POS_INT[:1],
                 "--seeds": ["a,b", "1,2,1"]},
    "evaluate": {"--batch-size": POS_INT[:2]},
    "predict": {"--batch-size": POS_INT[:2]},
    "task-data": {"--seed": NONNEG_INT},
    "fill-mask": {"--top-k": POS_INT, "--beam-size": [*POS_INT[:2], "5000"]},
    "embed": {"--max-length": ["1", "0"], "--batch-size": POS_INT[:2], "--top-k": POS_INT[:1], "--layers": ["a,b"]},
    "attention": {"--layers": ["x", ","]},
    "serve": {"--port": ["70000", "-1", "http"], "--max-batch": POS_INT[:2], "--timeout": POS_FLOAT[:2],
              "--max-length": POS_INT[:1], "--max-connections": POS_INT[:1], "--max-wait-ms": NONNEG_FLOAT[:1],
              "--threads": ["-1", "99999999"]},
    "export": {"--opset": ["999", "5", "x"], "--tolerance": NONNEG_FLOAT[:1]},
    "demo": {"--seed": NONNEG_INT[:1], "--pretrain-budget": POS_FLOAT[:2], "--vocab-size": POS_INT[:1]},
    "distill": {"--temperature": POS_FLOAT, "--alpha": PROB, "--student-layers": POS_INT[:2],
                "--hidden-weight": NONNEG_FLOAT, "--attention-weight": NONNEG_FLOAT[:1], "--batch-size": POS_INT[:1]},
}


def range_probes() -> list[Probe]:
    # argparse names the flag ("argument --top-k: ..."); serve's own check of its options does too ("--port must ...")
    return [Probe(f"range:{cmd}{flag}={v}", [*_BASE[cmd], flag, v], flag)
            for cmd, flags in _RANGES.items() for flag, values in flags.items() for v in values]


# argv of each command writing a directory, with OUT where the output goes
_DIR_CMDS = {
    "finetune": ["finetune", "--task", "classify", "--model", "W/mlm", "--train", "W/data/train.csv", "--dev",
                 "W/data/dev.csv", "--out", "OUT", "--epochs", "1", "--quiet"],
    "evaluate": ["evaluate", "--model", "W/clf", "--data", "W/data/dev.csv", "--out", "OUT"],
    "task-data": ["task-data", "sentiment", "--out", "OUT"],
    "vocab": ["vocab", "--files", "W/corpus.txt", "--vocab-size", "60", "--out", "OUT", "--no-progress"],
    "prepare": ["prepare", "--corpus", "W/corpus.txt", "--vocab", "W/vocab", "--out", "OUT", "--seq-len", "32"],
    "pretrain": ["pretrain", "W/shards", "--preset", "tiny", "--out", "OUT", "--steps", "1", "--no-progress"],
    "attention": ["attention", "W/mlm", "the man", "--out", "OUT"],
    "convert": ["convert", "W/tf", "OUT"],
    "demo": ["demo", "--out", "OUT", "--quiet"],
    "distill": ["distill", "--teacher", "W/clf", "--student-layers", "1", "--train", "W/data/train.csv", "--dev",
                "W/data/dev.csv", "--out", "OUT", "--epochs", "1", "--quiet"],
}
_DIR_INPUT = {"finetune": "W/mlm", "evaluate": "W/clf", "distill": "W/clf", "prepare": "W/vocab", "pretrain": "W/shards",
              "attention": "W/mlm", "convert": "W/tf"}
_REUSE = ("pretrain", "attention", "demo")          # their earlier run is reused, not refused
_OVERWRITE = {"demo": "--force", "pretrain": "--overwrite"}


def _with_out(argv, out, *extra):
    return [out if a == "OUT" else a for a in argv] + list(extra)


def dir_out_probes() -> list[Probe]:
    probes = []
    for cmd, argv in _DIR_CMDS.items():
        over = _OVERWRITE.get(cmd, "--overwrite")
        probes += [
            Probe(f"out:{cmd}:file", _with_out(argv, "W/file.txt"), "is a file"),
            Probe(f"out:{cmd}:under-file", _with_out(argv, "W/file.txt/sub"), "is a file, not a directory"),
            Probe(f"out:{cmd}:unwritable", _with_out(argv, "/sys/bertkit-probe/out"), "cannot write"),
            Probe(f"out:{cmd}:proc", _with_out(argv, "/proc/1/bertkit-out"), "cannot write"),
            Probe(f"out:{cmd}:nonempty", _with_out(argv, "W/nonempty"), "not empty"),
            Probe(f"out:{cmd}:symlink-loop", _with_out(argv, "W/loop", over), "loop"),
            Probe(f"out:{cmd}:empty", _with_out(argv, "", over), "empty"),
            Probe(f"out:{cmd}:dash", _with_out(argv, "-"), "not to stdout"),
            Probe(f"out:{cmd}:other-run", _with_out(argv, "T/out", over), "holds a `bertkit",
                  {"T/out/" + MARKER: {"command": "not-" + cmd}, "T/out/x.txt": b"kept"}),
        ]
        if cmd not in _REUSE:
            probes.append(Probe(f"out:{cmd}:own-run", _with_out(argv, "T/out"), "earlier `bertkit",
                                {"T/out/" + MARKER: {"command": cmd}, "T/out/result.json": b"{}"}))
        if cmd in _DIR_INPUT:
            probes.append(Probe(f"out:{cmd}:is-input", _with_out(argv, _DIR_INPUT[cmd], over), "is the input"))
        if cmd in ("evaluate", "task-data", "vocab", "prepare", "attention"):
            probes.append(Probe(f"out:{cmd}:model-dir", _with_out(argv, "W/mlm2", over), "model directory"))
    probes.append(Probe("out:finetune:own-run-holds-input",
                        _with_out(_DIR_CMDS["finetune"], "T/out", "--overwrite", "--test", "T/out/test.csv"),
                        "would delete", {"T/out/" + MARKER: {"command": "finetune"},
                                         "T/out/test.csv": b"text,label\nthe film,pos\n"}))
    return probes


_FILE_CMDS = {
    "predict": (["predict", "--model", "W/clf", "--data", "W/data/dev.csv", "--out", "OUT"], "W/data/dev.csv"),
    "plot": (["plot", "W/data/preds.jsonl", "--confusion", "--out", "OUT"], "W/data/preds.jsonl"),
    "export": (["export", "W/mlm", "OUT", "--no-check"], "W/mlm/config.json"),   # a file of the input model
}


def file_out_probes() -> list[Probe]:
    probes = []
    for cmd, (argv, an_input) in _FILE_CMDS.items():
        probes += [
            Probe(f"fout:{cmd}:under-file", _with_out(argv, "W/file.txt/x.out"), "is a file, not a directory"),
            Probe(f"fout:{cmd}:unwritable", _with_out(argv, "/sys/bertkit-probe.out"), "cannot write"),
            Probe(f"fout:{cmd}:is-input", _with_out(argv, an_input, "--overwrite"), "input"),
            Probe(f"fout:{cmd}:exists", _with_out(argv, "W/file.txt"), "exists; pass --overwrite"),
            Probe(f"fout:{cmd}:symlink-loop", _with_out(argv, "W/loop", "--overwrite"), "loop"),
            Probe(f"fout:{cmd}:name-too-long", _with_out(argv, "T/" + "x" * 300 + ".png", "--overwrite"),
                  "too long"),
            Probe(f"fout:{cmd}:device", _with_out(argv, "/dev/null", "--overwrite"), "not a regular file"),
            Probe(f"fout:{cmd}:dash", _with_out(argv, "-"), "not to stdout"),
            Probe(f"fout:{cmd}:dir-in-the-way", _with_out(argv, "T/o/", "--overwrite"), "is a directory",
                  {f"T/o/{n}/x": b"" for n in ("dev.predictions.jsonl", "embeddings.jsonl", "preds.confusion.png",
                                               "model.onnx")}),
        ]
    embed = ["embed", "W/mlm", "--file", "W/data/sents.txt", "--out"]   # .npy / .jsonl: vectors; else an index
    probes += [
        Probe("fout:embed:under-file", embed + ["W/file.txt/x.jsonl"], "is a file, not a directory"),
        Probe("fout:embed:unwritable", embed + ["/sys/bertkit-probe.jsonl"], "cannot write"),
        Probe("fout:embed:exists", embed + ["T/v.jsonl"], "exists; pass --overwrite", {"T/v.jsonl": b"{}\n"}),
        Probe("arg:quantize:max-drop", ["quantize", "W/clf", "T/q", "--max-drop", "-1"], "--max-drop"),
        Probe("in:quantize:missing", ["quantize", "W/none", "T/q"], "none"),
        Probe("fout:quantize:is-input", ["quantize", "W/clf", "W/clf", "--overwrite"], "input"),
        Probe("fout:quantize:not-empty", ["quantize", "W/clf", "T/q"], "not empty", {"T/q/x": b""}),
        Probe("fout:quantize:a-file", ["quantize", "W/clf", "W/file.txt"], "is a file"),
        Probe("in:quantize:check-missing", ["quantize", "W/clf", "T/q", "--check", "W/none.csv"], "none.csv"),
        Probe("in:quantize:model-is-a-file", ["quantize", "W/file.txt", "T/q"], "is a file; expected"),
        Probe("arg:quantize:max-drop-dashes", ["quantize", "W/clf", "T/q", "--max-drop=--"], "expected one argument"),
        Probe("arg:quantize:keep-float-typo", ["quantize", "W/clf", "T/q", "--keep-float", "Classifier"],
              "matches no linear layer"),
        Probe("in:rerank:missing", ["rerank", "W/clf", "--query", "a", "--file", "W/none.txt"], "none.txt"),
        Probe("arg:rerank:top-k-0", ["rerank", "W/clf", "--query", "a", "--file", "W/data/sents.txt", "--top-k", "0"],
              "--top-k"),
        Probe("fout:embed:index-is-a-file", embed + ["W/file.txt", "--overwrite"], "expected an index directory"),
        Probe("fout:embed:index-is-input", embed + ["W/data/", "--overwrite"], "holds the input"),
        Probe("fout:embed:index-not-empty", embed + ["T/o/", "--overwrite"], "holds no index", {"T/o/x": b""}),
        Probe("fout:embed:index-unwritable", embed + ["/sys/bertkit-index/"], "cannot write"),
        Probe("fout:search:no-index", ["search", "T/o", "--query", "a"], "T/o", {"T/o/x": b""}),
        Probe("fout:mine:exists", ["mine", "W/mlm", "--data", "W/data/sents.txt", "--out", "W/file.txt"],
              "exists; pass --overwrite"),
    ]
    return probes


def input_probes() -> list[Probe]:
    ft = ["finetune", "--model", "W/mlm", "--out", "T/out", "--epochs", "1", "--quiet"]
    probes = []
    for task, ext in (("classify", "csv"), ("tag", "conll"), ("qa", "json")):
        for kind in ("bin", "latin"):
            probes.append(Probe(f"in:finetune:{task}:{kind}:train", [*ft, "--task", task, "--train",
                                f"W/data/{kind}.{ext}", "--dev", "W/data/dev.csv"], f"{kind}.{ext}"))
    probes += [
        Probe("in:finetune:dev-binary", [*ft, "--task", "classify", "--train", "W/data/train.csv", "--dev",
                                         "W/data/bin.csv"], "bin.csv"),
        Probe("in:finetune:jsonl-long-int", [*ft, "--task", "classify", "--train", "T/big.jsonl", "--dev",
                                             "W/data/dev.csv"], "big.jsonl:1: not valid JSON",
              {"T/big.jsonl": b'{"text": "the film", "label": ' + LONG_INT + b"}\n"}),
        Probe("in:finetune:squad-long-int", [*ft, "--task", "qa", "--train", "T/big.json", "--dev",
                                             "W/data/dev.csv"], "big.json",
              {"T/big.json": b'{"data": ' + LONG_INT + b"}"}),
        Probe("in:plot:metrics-long-int", ["plot", "T/run", "--out", "T/p.png"], "metrics.jsonl:1",
              {"T/run/metrics.jsonl": b'{"step": 1, "loss": ' + LONG_INT + b"}\n"}),
        Probe("in:plot:confusion-long-int", ["plot", "T/p.jsonl", "--confusion", "--out", "T/c.png"], "p.jsonl:1",
              {"T/p.jsonl": b'{"label": ' + LONG_INT + b', "prediction": "a"}\n'}),
        Probe("in:finetune:missing", [*ft, "--task", "classify", "--train", "W/nope.csv", "--dev", "W/data/dev.csv"],
              "nope.csv"),
        Probe("in:finetune:duplicate-column", [*ft, "--task", "classify", "--train", "T/dup.csv", "--dev",
                                               "W/data/dev.csv"], "dup.csv: duplicate column 'label' in the header",
              {"T/dup.csv": b"text,label,label\nthe film,pos,neg\n"}),
        Probe("in:finetune:regress-nan", [*ft, "--task", "regress", "--train", "T/r.csv", "--dev", "T/r.csv"],
              "r.csv:3: regression label 'nan' is not a finite number", {"T/r.csv": b"text,label\na,1\nthe,nan\n"}),
        Probe("in:finetune:list-label", [*ft, "--task", "classify", "--train", "T/l.jsonl", "--dev", "W/data/dev.csv"],
              "l.jsonl:2: label ['neg'] is a list", {"T/l.jsonl": b'{"text": "a", "label": "pos"}\n'
                                                                  b'{"text": "the", "label": ["neg"]}\n'}),
        Probe("in:finetune:qa-duplicate-id", [*ft, "--task", "qa", "--train", "T/q.json", "--dev", "T/q.json"],
              "q.json: duplicate question id 'q1'", {"T/q.json": json.dumps({"data": [{"paragraphs": [
                  {"context": "the dog", "qas": [{"id": "q1", "question": "a", "answers": [{"text": "dog",
                   "answer_start": 4}]}] * 2}]}]}).encode()}),
        Probe("in:finetune:train-is-dir", [*ft, "--task", "classify", "--train", "W/data", "--dev",
                                           "W/data/dev.csv"], "data"),
        Probe("in:finetune:missing-model", [*ft[:2], "W/nomodel", *ft[3:], "--task", "classify", "--train",
                                            "W/data/train.csv", "--dev", "W/data/dev.csv"], "nomodel"),
        Probe("in:evaluate:binary", ["evaluate", "--model", "W/clf", "--data", "W/data/bin.csv"], "bin.csv"),
        Probe("in:evaluate:latin", ["evaluate", "--model", "W/clf", "--data", "W/data/latin.csv"], "latin.csv:3"),
        Probe("in:evaluate:not-finetuned", ["evaluate", "--model", "W/mlm", "--data", "W/data/dev.csv"], "bertkit"),
        Probe("in:predict:binary", ["predict", "--model", "W/clf", "--data", "W/data/bin.csv", "--out", "T/p.jsonl"],
              "bin.csv"),
        Probe("in:predict:latin", ["predict", "--model", "W/clf", "--data", "W/data/latin.csv", "--out",
                                   "T/p.jsonl"], "latin.csv:3"),
        Probe("in:predict:jsonl-binary", ["predict", "--model", "W/clf", "--data", "W/data/bin.jsonl", "--out",
                                          "T/p.jsonl"], "bin.jsonl"),
        Probe("in:predict:missing", ["predict", "--model", "W/clf", "--data", "W/none.csv", "--out", "T/p.jsonl"],
              "none.csv"),
        Probe("in:embed:binary", ["embed", "W/mlm", "--file", "W/data/bin.txt"], "bin.txt:2"),
        Probe("in:embed:missing", ["embed", "W/mlm", "--file", "W/none.txt"], "none.txt"),
        Probe("in:embed:nothing", ["embed", "W/mlm"], "no texts"),
        Probe("in:plot:binary-metrics", ["plot", "W/badrun", "--out", "T/c.png"], "metrics.jsonl"),
        Probe("in:plot:binary-confusion", ["plot", "W/data/bin.jsonl", "--confusion", "--out", "T/c.png"],
              "bin.jsonl"),
        Probe("in:plot:empty-run", ["plot", "W/nonempty", "--out", "T/c.png"], "metrics"),
        Probe("in:plot:not-a-picture", ["plot", "W/run", "--out", "T/c.txt"], "suffixes"),
        Probe("in:plot:no-suffix", ["plot", "W/run", "--out", "T/curves"], "suffixes"),
        Probe("in:finetune:symlink-loop", [*ft, "--task", "classify", "--train", "W/loop", "--dev", "W/data/dev.csv"],
              "loop"),
        Probe("in:embed:symlink-loop", ["embed", "W/mlm", "--file", "W/loop"], "loop"),
        Probe("in:plot:missing", ["plot", "W/none.jsonl", "--confusion", "--out", "T/c.png"], "none.jsonl"),
        Probe("in:pretrain:config-binary", ["pretrain", "W/shards", "--config", "W/cfg_bin.json", "--out", "T/r",
                                            "--steps", "1"], "cfg_bin.json"),
        Probe("in:pretrain:config-list", ["pretrain", "W/shards", "--config", "W/cfg_list.json", "--out", "T/r",
                                          "--steps", "1"], "cfg_list.json"),
        Probe("in:pretrain:shards-missing", ["pretrain", "W/none", "--preset", "tiny", "--out", "T/r", "--steps",
                                             "1"], "none"),
        Probe("in:pretrain:shards-not-shards", ["pretrain", "W/nonempty", "--preset", "tiny", "--out", "T/r",
                                                "--steps", "1"], "nonempty"),
        Probe("in:tokenize:missing", ["tokenize", "--vocab", "W/vocab/vocab.txt", "--file", "W/none.txt"],
              "none.txt"),
        Probe("in:tokenize:vocab-binary", ["tokenize", "--vocab", "W/data/bin.txt", "x"], "bin.txt"),
        Probe("in:tokenize:file-is-dir", ["tokenize", "--vocab", "W/vocab/vocab.txt", "--file", "W/data"], "data"),
        Probe("in:vocab:missing", ["vocab", "--files", "W/none*.txt", "--out", "T/v"], "none"),
        Probe("in:prepare:missing-corpus", ["prepare", "--corpus", "W/none.txt", "--vocab", "W/vocab", "--out",
                                            "T/s"], "none"),
        Probe("in:prepare:vocab-binary", ["prepare", "--corpus", "W/corpus.txt", "--vocab", "W/data/bin.txt",
                                          "--out", "T/s"], "bin.txt"),
        Probe("in:convert:config-binary", ["convert", "W/tf", "T/c", "--config", "W/cfg_bin.json"], "cfg_bin.json"),
        Probe("in:convert:config-list", ["convert", "W/tf", "T/c", "--config", "W/cfg_list.json"], "cfg_list.json"),
        Probe("in:convert:vocab-binary", ["convert", "W/tf", "T/c", "--vocab", "W/data/bin.txt"], "bin.txt"),
        Probe("in:convert:missing", ["convert", "W/none", "T/c"], "none"),
        Probe("in:convert:not-a-checkpoint", ["convert", "W/nonempty", "T/c"], "nonempty"),
        Probe("in:export:missing-model", ["export", "W/none", "T/m.onnx", "--no-check"], "none"),
        Probe("in:fill-mask:missing-model", ["fill-mask", "W/none", "the [MASK]"], "none"),
        Probe("in:fill-mask:no-mask", ["fill-mask", "W/mlm", "nothing to fill"], "[MASK]"),
        Probe("in:serve:missing-model", ["serve", "W/none", "--port", "0"], "none"),
    ]
    return probes


def model_probes() -> list[Probe]:
    probes = []
    for name, match in (("listcfg", "config.json"), ("hugepos", "max_position_embeddings")):
        probes += [
            Probe(f"model:{name}:fill-mask", ["fill-mask", f"W/{name}", "the [MASK]"], match),
            Probe(f"model:{name}:embed", ["embed", f"W/{name}", "the man"], match),
            Probe(f"model:{name}:attention", ["attention", f"W/{name}", "the man", "--out", "T/a"], match),
            Probe(f"model:{name}:export", ["export", f"W/{name}", "T/m.onnx", "--no-check"], match),
            Probe(f"model:{name}:finetune", ["finetune", "--task", "classify", "--model", f"W/{name}", "--train",
                                             "W/data/train.csv", "--dev", "W/data/dev.csv", "--out", "T/f",
                                             "--quiet"], match),
        ]
    probes += [
        Probe("attention:query-absent", ["attention", "W/mlm", "the man", "--query", "zebra", "--out", "T/a"],
              "--query 'zebra'"),
        Probe("attention:layers-99", ["attention", "W/mlm", "the man", "--layers", "99", "--out", "T/a"],
              "--layers 99"),
        Probe("attention:layers-neg", ["attention", "W/mlm", "the man", "--layers", "0,-7", "--out", "T/a"],
              "--layers -7"),
        Probe("embed:layers-99", ["embed", "W/mlm", "the man", "--layers", "99"], "layers"),
        Probe("tokenize:no-vocab", ["tokenize", "x"], "--vocab"),
        Probe("tokenize:both", ["tokenize", "--vocab", "W/vocab/vocab.txt", "x", "--file", "W/data/sents.txt"],
              "not both"),
        Probe("task-data:unknown", ["task-data", "nope", "--out", "T/t"], "unknown task"),
        Probe("demo:unknown-stage", ["demo", "--out", "T/d", "--only", "nope"], "unknown stage"),
        Probe("finetune:unknown-task", ["finetune", "--task", "nope"], "invalid choice"),
        Probe("usage:unknown-command", ["nope"], "invalid choice"),
        Probe("usage:missing-required", ["predict", "--model", "W/clf"], "required"),
        Probe("pretrain:no-length", ["pretrain", "W/shards", "--preset", "tiny", "--out", "T/r"], "--steps"),
        Probe("pretrain:no-model", ["pretrain", "W/shards", "--out", "T/r", "--steps", "1"], "--preset"),
    ]
    return probes


_MODEL_READERS = {      # M: the model directory
    "fill-mask": ["fill-mask", "M", "the [MASK]"],
    "embed": ["embed", "M", "the man"],
    "attention": ["attention", "M", "the man", "--out", "T/a"],
    "export": ["export", "M", "T/m.onnx", "--no-check"],
    "finetune": ["finetune", "--task", "classify", "--model", "M", "--train", "W/data/train.csv", "--dev",
                 "W/data/dev.csv", "--out", "T/f", "--quiet"],
}
_TASK_MODEL_READERS = {
    "evaluate": ["evaluate", "--model", "M", "--data", "W/data/dev.csv"],
    "predict": ["predict", "--model", "M", "--data", "W/data/dev.csv", "--out", "T/p.jsonl"],
    "quantize": ["quantize", "M", "T/q"],
}


def hostile_json_probes() -> list[Probe]:
    # quantize copies the tokenizer files as they are (it never reads them): their refusal comes where they are read
    return [Probe(f"json:{name}:{cmd}", [f"W/{base}-{name}" if a == "M" else a for a in argv], match)
            for base, cmds in (("mlm", _MODEL_READERS), ("clf", _TASK_MODEL_READERS))
            for name, (_, _, match) in _SPOILED.items() for cmd, argv in cmds.items()
            if not (cmd == "quantize" and name.startswith("tok-"))]


def sentence_json_probes() -> list[Probe]:
    """Hostile JSON of the wrong type or NaN in the files of a sentence-transformers directory, an index and shards;
    a table 100,000 columns wide (read in linear time, named in a line of bounded length); JSONL cells that are no
    text or number (an object or a list where a text goes); file names with control characters."""
    probes = [Probe(f"json:st-{name}:embed", ["embed", f"W/st-{name}", "the man"], match)
              for name, (_, _, _, match) in _ST_SPOILED.items()]
    probes.append(Probe("json:shards-task-x:pretrain", ["pretrain", "W/shards-task-x", "--preset", "tiny", "--out",
                                                        "T/r", "--steps", "1", "--no-progress"], "task 'x'"))
    wide = b",".join(b"c%d" % i for i in range(100_000)) + b"\n" + b",".join([b"x"] * 100_000) + b"\n"
    probes += [Probe(f"wide:{cmd}", [*argv, "T/wide.csv"], "(100000 columns)", {"T/wide.csv": wide}) for cmd, argv in (
        ("evaluate", ["evaluate", "--model", "W/clf", "--data"]),
        ("mine", ["mine", "W/mlm", "--out", "T/m.jsonl", "--data"]),
        ("finetune-embed", ["finetune", "--task", "embed", "--model", "W/mlm", "--out", "T/f", "--dev", "T/wide.csv",
                            "--train"]))]
    cells = {"list-text": b'{"text": ["the film"], "label": "pos"}\n',
             "dict-label": b'{"text": "a", "label": {"a": 1}}\n',
             "dict-pair": b'{"text": "a", "text_pair": {"b": 2}, "label": "pos"}\n',
             "list-in-labels": b'{"text": "a", "label": ["pos", ["neg"]]}\n'}
    probes += [Probe(f"cell:{cmd}:{name}", [*argv, "T/c.jsonl"], "column '", {"T/c.jsonl": data})
               for name, data in cells.items() for cmd, argv in (
                   ("evaluate", ["evaluate", "--model", "W/clf", "--data"]),
                   ("finetune", ["finetune", "--task", "classify", "--model", "W/mlm", "--out", "T/f", "--dev",
                                 "W/data/dev.csv", "--train"]))]
    probes += [  # a file name with a newline or a terminal escape: named escaped, so the error stays one line
        Probe("name:predict:newline", ["predict", "--model", "W/clf", "--data", "T/no\nsuch.csv", "--out", "T/p.jsonl"],
              "no\\nsuch.csv"),
        Probe("name:predict:newline-latin1", ["predict", "--model", "W/clf", "--data", "T/a\rb.csv", "--out",
                                              "T/p.jsonl"], "a\\rb.csv:3: not UTF-8", {"T/a\rb.csv": LATIN1}),
        Probe("name:fill-mask:escape", ["fill-mask", "T/x\x1b[31m", "the [MASK]"], "x\\x1b[31m")]
    return probes + [Probe(f"json:index-source-{name}:search", ["search", f"W/index-source-{name}", "--query", "a"],
                           "bertkit_source.json") for name in _SOURCE_SPOILED]


FIFO = b"<a named pipe>"        # a setup value: make a FIFO there (nothing ever writes to it)
_FT = ["finetune", "--model", "W/mlm", "--train", "W/data/train.csv", "--dev", "W/data/dev.csv", "--out", "T/f",
       "--epochs", "1", "--quiet"]
_SQUAD = {"data": [{"title": "t", "paragraphs": [{"context": "the dog run", "qas": [
    {"id": "q1", "question": "what", "answers": [{"text": "dog", "answer_start": -5}]}]}]}]}


def accepted_silently_probes() -> list[Probe]:
    """What was taken without a word (or crashed later): refused before any work."""
    qa = ["finetune", "--task", "qa", "--model", "W/mlm", "--train", "T/q.json", "--dev", "T/q.json", "--out", "T/f",
          "--quiet"]
    good_squad = json.loads(json.dumps(_SQUAD))
    good_squad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 4
    masks = lambda n: " ".join(["[MASK]"] * n)      # noqa: E731
    probes = [
        Probe("said:finetune:max-length-1", [*_FT, "--task", "classify", "--max-length", "1"], "--max-length 1"),
        Probe("said:finetune:max-length-4", [*_FT, "--task", "tag", "--max-length", "4"], "--max-length 4"),
        Probe("said:finetune:scheme-on-classify", [*_FT, "--task", "classify", "--scheme", "BIOES"], "--scheme"),
        Probe("said:finetune:scheme-on-regress", [*_FT, "--task", "regress", "--scheme", "IOB2"], "--scheme"),
        Probe("said:finetune:qa-negative-start", qa, "answer_start", {"T/q.json": _SQUAD}),
        Probe("said:finetune:qa-query-fills-input", [*qa, "--max-query-length", "500", "--max-length", "64"],
              "--max-query-length 500", {"T/q.json": good_squad}),
        Probe("said:finetune:qa-query-equals-input", [*qa, "--max-query-length", "60", "--max-length", "64"],
              "--max-query-length 60", {"T/q.json": good_squad}),
        Probe("said:embed:int8-npy", ["embed", "W/mlm", "the man", "--dtype", "int8", "--out", "T/e.npy"],
              "--dtype int8"),
        Probe("said:embed:float16-jsonl", ["embed", "W/mlm", "the man", "--dtype", "float16", "--out", "T/e.jsonl"],
              "--dtype float16"),
        Probe("said:embed:int8-stdout", ["embed", "W/mlm", "the man", "--dtype", "int8"], "--dtype int8"),
        Probe("said:embed:int8-search", ["embed", "W/mlm", "the man", "--dtype", "int8", "--search", "a"], "--dtype"),
        Probe("trace:fill-mask:300-masks", ["fill-mask", "W/mlm", masks(300)], "at most 8"),
        Probe("trace:fill-mask:9-masks", ["fill-mask", "W/mlm", masks(9)], "9 [MASK]s"),
        Probe("trace:fill-mask:file-300-masks", ["fill-mask", "W/mlm", "--file", "T/m.txt"], "at most 8",
              {"T/m.txt": ("the [MASK]\n" + masks(300) + "\n").encode()}),
        Probe("trace:plot:nan-losses", ["plot", "T/run", "--out", "T/c.png"], "no finite",
              {"T/run/metrics.jsonl": b'{"step": 1, "loss": NaN}\n{"step": 2, "loss": Infinity}\n'}),
        Probe("trace:plot:nan-steps", ["plot", "T/run", "--out", "T/c.png"], "no finite",
              {"T/run/metrics.jsonl": b'{"step": NaN, "lr": 1}\n{"step": -Infinity, "loss": NaN}\n'}),
        Probe("loss:prepare:empty-corpus-overwrite", ["prepare", "--corpus", "T/empty.txt", "--vocab", "W/vocab",
                                                      "--out", "T/s", "--overwrite"], "no examples",
              {"T/empty.txt": b"", "T/s/" + MARKER: {"command": "prepare"}, "T/s/w00-00000.tokens.npy": b"earlier",
               "T/s/manifest.json": b"{}"}),
    ]
    probes += [Probe(f"trace:search:cut-{part}", ["search", f"W/index-cut-{part}", "--query", "a dog"],
                     f"index-cut-{part}") for part in ("vectors", "ids", "manifest")]
    probes += [Probe(f"trace:evaluate:{name}", ["evaluate", "--model", f"W/clf-{name}", "--data", "W/data/dev.csv",
                                                "--out", "T/e"], "config.json") for name in ("cfg-empty", "cfg-deep")]
    probes += [Probe(f"trace:distill:{name}", ["distill", "--teacher", f"W/clf-{name}", "--student-layers", "1",
                                               "--train", "W/data/train.csv", "--dev", "W/data/dev.csv",
                                               "--out", "T/d"], "config.json")
               for name in ("cfg-empty", "cfg-deep", "cfg-binary", "cfg-string")]
    return probes


_INDEX_TEXTS = {"not-json": b"not json\n\"b\"\n", "deep": b"[" * 100_000 + b"]" * 100_000 + b"\n\"b\"\n",
                "number": b"5\n\"b\"\n", "short": b"\"a\"\n"}
_INDEX = ["embed", "W/mlm", "--file", "W/data/sents.txt", "--out", "T/o/"]
_VOCAB_OVER = ["vocab", "--files", "W/corpus.txt", "--vocab-size", "60", "--out", "T/v", "--no-progress"]


def beside_out_probes() -> list[Probe]:
    """What an index build keeps beside its --out (`.NAME.parts/`) and a run's marker in --out, spoiled by a user:
    a folder of theirs is never removed, a hostile file is one line naming it."""
    probes = [
        Probe("beside:embed:users-parts-folder", _INDEX, ".o.parts: holds something else", {"T/.o.parts/notes": b"x"}),
        Probe("beside:embed:parts-is-a-file", _INDEX, ".o.parts: holds something else", {"T/.o.parts": b"mine"}),
        Probe("beside:embed:plan-deep", _INDEX, "plan.json: JSON nested too deeply",
              {"T/.o.parts/plan.json": b"[" * 100_000 + b"]" * 100_000}),
        Probe("beside:embed:plan-binary", _INDEX, "plan.json: not UTF-8", {"T/.o.parts/plan.json": BINARY}),
        Probe("marker:vocab:keep-a-number", _VOCAB_OVER, "is not empty",
              {"T/v/" + MARKER: {"command": "vocab", "keep": 5}, "T/v/vocab.txt": b"x"}),
    ]
    return probes + [Probe(f"index-texts:{name}:search", ["search", f"W/index-texts-{name}", "--query", "a dog"],
                           "texts.jsonl") for name in _INDEX_TEXTS]


def late_probes() -> list[Probe]:
    """Values that used to reach torch / zlib / a whole demo before anything looked at them."""
    return [
        Probe("trace:finetune:seed-past-64-bits", [*_FT, "--task", "classify", "--seeds", "9" * 30], "--seeds"),
        Probe("trace:prepare:gzip-broken", ["prepare", "--corpus", "T/c.txt.gz", "--vocab", "W/vocab", "--out", "T/s"],
              "c.txt.gz", {"T/c.txt.gz": b"\x1f\x8b\x08\x00garbage-garbage"}),
        Probe("hang:demo:preset-unknown", ["demo", "--out", "T/d", "--preset", "evil"], "--preset"),
    ]


def fifo_probes() -> list[Probe]:
    """A named pipe where an output goes: refused by its kind, never opened (which would wait for a reader)."""
    probes = [Probe(f"fifo:{cmd}:out", _with_out(argv, "T/pipe", _OVERWRITE.get(cmd, "--overwrite")),
                    "expected a directory", {"T/pipe": FIFO}) for cmd, argv in _DIR_CMDS.items()]
    probes += [Probe(f"fifo:{cmd}:out", _with_out(argv, "T/pipe", "--overwrite"), "not a regular file",
                     {"T/pipe": FIFO}) for cmd, (argv, _) in _FILE_CMDS.items()]
    probes += [
        Probe("fifo:embed:npy", ["embed", "W/mlm", "the man", "--out", "T/pipe.npy", "--overwrite"],
              "not a regular file", {"T/pipe.npy": FIFO}),
        Probe("fifo:embed:jsonl", ["embed", "W/mlm", "the man", "--out", "T/pipe.jsonl", "--overwrite"],
              "not a regular file", {"T/pipe.jsonl": FIFO}),
        Probe("fifo:embed:index", ["embed", "W/mlm", "the man", "--out", "T/pipe", "--overwrite"],
              "expected an index directory", {"T/pipe": FIFO}),
        Probe("fifo:mine:out", ["mine", "W/mlm", "--data", "W/data/train.csv", "--out", "T/pipe.jsonl",
                                "--overwrite"], "not a regular file", {"T/pipe.jsonl": FIFO}),
        Probe("fifo:quantize:out", ["quantize", "W/clf", "T/pipe", "--overwrite"], "is a file", {"T/pipe": FIFO}),
        Probe("fifo:predict:into-dir", ["predict", "--model", "W/clf", "--data", "W/data/dev.csv", "--out", "T/o/",
                                        "--overwrite"], "not a regular file", {"T/o/dev.predictions.jsonl": FIFO}),
    ]
    return probes


def serve_probes(port: str) -> list[Probe]:
    return [
        Probe("serve:busy-port", ["serve", "W/mlm", "--port", port], "in use"),
        Probe("serve:bad-host", ["serve", "W/mlm", "--host", "no such host", "--port", "0"], "--host"),
        Probe("serve:unknown-host", ["serve", "W/mlm", "--host", "256.300.1.1", "--port", "0"], "256.300.1.1"),
        Probe("serve:port-70000", ["serve", "W/mlm", "--port", "70000"], "--port"),
    ]


ALL = (range_probes() + dir_out_probes() + file_out_probes() + input_probes() + model_probes() + hostile_json_probes()
       + accepted_silently_probes() + fifo_probes() + sentence_json_probes() + beside_out_probes()
       + late_probes())
SERVE = serve_probes("PORT")


def test_the_campaign_has_at_least_250_probes_over_every_subcommand():
    from bertkit.cli import build_parser
    probes = ALL + SERVE
    assert len(probes) >= 250, len(probes)
    assert len({p.name for p in probes}) == len(probes), "probe names are unique"
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    covered = {p.argv[0] for p in probes}
    assert set(sub.choices) <= covered, set(sub.choices) - covered
    print(f"campaign: {len(probes)} probes over {len(set(sub.choices))} subcommands")


def test_the_installed_entry_point_prints_one_line(world):
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    r = subprocess.run([sys.executable, "-m", "bertkit", "predict", "--model", str(world / "clf"), "--data",
                        str(world / "data" / "dev.csv"), "--out", str(world / "data" / "dev.csv"), "--overwrite"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is the input" in r.stderr, r.stderr


# ------------------------------------------------------------------------------------------------ the runner

def _digest(root: Path) -> dict[str, str]:
    out = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "fifo" if p.is_fifo() else "dir"
    return out


def _paths(argv, w: Path, t: Path) -> list[str]:
    return [str(w / a[2:]) if a.startswith("W/") else str(t / a[2:]) if a.startswith("T/") else a for a in argv]


def run_cli(argv, capsys) -> tuple[object, str, str]:
    """(exit code, stdout, stderr) of `bertkit ARGV` in-process; an escaping exception is a traceback."""
    from bertkit.cli import main
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    except BaseException as e:  # noqa: BLE001 - any escape is what the campaign counts
        rc = "traceback: " + "".join(traceback.format_exception_only(e)).strip()
    out, err = capsys.readouterr()
    return rc, out, err


def _check(probe: Probe, w: Path, t: Path, capsys) -> None:
    for rel, content in probe.setup.items():
        p = t / rel[2:]
        p.parent.mkdir(parents=True, exist_ok=True)
        if content is FIFO:
            os.mkfifo(p)
        else:
            p.write_bytes(json.dumps(content).encode() if isinstance(content, dict) else content)
    before = (_digest(w), _digest(t))
    rc, _, err = run_cli(_paths(probe.argv, w, t), capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, f"{probe.name}: exit {rc}; stderr: {err[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("bertkit") and "error" in lines[0], f"{probe.name}: {err!r}"
    assert probe.match.lower() in lines[0].lower(), f"{probe.name}: {lines[0]!r} lacks {probe.match!r}"
    assert (_digest(w), _digest(t)) == before, f"{probe.name}: files changed"


@pytest.mark.parametrize("probe", ALL, ids=[p.name for p in ALL])
def test_probe(probe, world, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _check(probe, world, tmp_path / "T", capsys)


@pytest.mark.parametrize("probe", SERVE, ids=[p.name for p in SERVE])
def test_serve_probe(probe, world, busy_port, tmp_path, capsys):
    for extra in ("fastapi", "uvicorn"):   # without the serve extra, serve stops at the install hint before the port
        pytest.importorskip(extra)
    probe = Probe(probe.name, [busy_port if a == "PORT" else a for a in probe.argv], probe.match)
    _check(probe, world, tmp_path / "T", capsys)


# ------------------------------------------------------------------------------------------------ what does work

def _finetune_argv(w: Path, out: Path, *extra) -> list[str]:
    return ["finetune", "--task", "classify", "--model", str(w / "mlm"), "--train", str(w / "data" / "train.csv"),
            "--dev", str(w / "data" / "dev.csv"), "--out", str(out), "--epochs", "1", "--batch-size", "8", "--fp32",
            "--quiet", *extra]


@pytest.mark.slow
def test_a_second_run_is_refused_and_overwrite_clears_the_first(world, tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = run_cli(_finetune_argv(world, out, "--test", str(world / "data" / "dev.csv")), capsys)
    assert rc == 0, err
    first = _digest(out)
    assert any("test" in name for name in first), sorted(first)
    rc, _, err = run_cli(_finetune_argv(world, out), capsys)
    assert rc == 2 and "--overwrite" in err and _digest(out) == first     # refused, nothing touched
    rc, _, err = run_cli(_finetune_argv(world, out, "--overwrite"), capsys)
    assert rc == 0, err
    assert not any("test" in name for name in _digest(out)), "the first run's test outputs were left behind"


def test_predict_into_a_directory_writes_a_file_inside(world, tmp_path, capsys):
    (tmp_path / "preds").mkdir()
    rc, out, err = run_cli(["predict", "--model", str(world / "clf"), "--data", str(world / "data" / "dev.csv"),
                            "--out", str(tmp_path / "preds")], capsys)
    assert rc == 0, err
    written = tmp_path / "preds" / "dev.predictions.jsonl"
    assert out.strip() == str(written) and len(written.read_text().splitlines()) == 8
    assert sorted(p.name for p in (tmp_path / "preds").iterdir()) == [written.name]     # no temp files left


def _enospc(*args, **kwargs):
    paths = [Path(a) for a in args if isinstance(a, (str, Path)) and Path(a).parent.name.startswith(".bertkit-tmp")]
    for p in paths:         # half an output file first, as a disk filling up mid-write leaves it
        p.write_bytes(b"half")
    raise OSError(errno.ENOSPC, "No space left on device", str(paths[0]) if paths else None)


@pytest.mark.parametrize("case", ["predict", "embed-npy", "embed-jsonl", "plot", "attention", "vocab"])
def test_a_full_disk_is_one_line_and_keeps_the_earlier_output(case, world, tmp_path, capsys, monkeypatch):
    import numpy as np
    from bertkit import plots
    from bertkit.tasks import runner
    out = tmp_path / "out"
    earlier = {"predict": "p.jsonl", "embed-npy": "v.npy", "embed-jsonl": "v.jsonl", "plot": "c.png",
               "attention": "attention_grid.png", "vocab": "vocab.txt"}[case]
    out.mkdir()
    (out / earlier).write_bytes(b"the earlier output")
    if case in ("attention", "vocab"):
        (out / MARKER).write_text(json.dumps({"command": case}))
    W = world
    argv, target = {
        "predict": (["predict", "--model", str(W / "clf"), "--data", str(W / "data/dev.csv"), "--out",
                     str(out / earlier), "--overwrite"], (runner, "predict")),
        "embed-npy": (["embed", str(W / "mlm"), "the man", "--out", str(out / earlier), "--overwrite"], (np, "save")),
        "embed-jsonl": (["embed", str(W / "mlm"), "the man", "--out", str(out / earlier), "--overwrite"],
                        (json, "dumps")),
        "plot": (["plot", str(W / "data/preds.jsonl"), "--confusion", "--out", str(out / earlier), "--overwrite"],
                 (plots, "plot_confusion")),
        "attention": (["attention", str(W / "mlm"), "the man", "--out", str(out), "--overwrite"],
                      (plots, "plot_attention")),
        "vocab": (["vocab", "--files", str(W / "corpus.txt"), "--vocab-size", "60", "--out", str(out),
                   "--overwrite", "--no-progress"], (os, "replace")),
    }[case]
    before = _digest(out)
    monkeypatch.setattr(*target, _enospc)
    rc, _, err = run_cli(argv, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "No space left on device" in lines[0], err
    if before is not None:
        assert _digest(out) == before, "the earlier output changed or a temp file was left"
    assert not [p for p in out.rglob("*") if "tmp" in p.name], "a temp file was left"


def test_dash_reads_stdin(world, capsys, monkeypatch):
    import io
    import sys
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the man is eating food\na dog run\n")))
    rc, out, err = run_cli(["embed", str(world / "mlm"), "--file", "-", "--search", "a dog", "--top-k", "1"], capsys)
    assert rc == 0, err
    assert json.loads(out)["hits"][0]["text"] == "a dog run"


def test_documented_lenient_readers_count_bad_bytes(world, tmp_path, capsys):
    """tokenize and vocab document replacing invalid UTF-8 (and vocab counts it): no refusal, no traceback."""
    rc, out, err = run_cli(["tokenize", "--vocab", str(world / "vocab" / "vocab.txt"), "--file",
                            str(world / "data" / "latin.csv")], capsys)
    assert rc == 0 and len(out.splitlines()) == 3, err
    rc, out, err = run_cli(["vocab", "--files", str(world / "data" / "latin.csv"), "--vocab-size", "80", "--out",
                            str(tmp_path / "v"), "--no-progress"], capsys)
    assert rc == 0 and "invalid UTF-8" in err, err


def test_overwrite_keeps_files_it_did_not_write(world, tmp_path, capsys):
    out = tmp_path / "v"
    out.mkdir()
    (out / "notes.txt").write_text("someone's notes")
    argv = ["vocab", "--files", str(world / "corpus.txt"), "--vocab-size", "60", "--out", str(out), "--no-progress"]
    assert run_cli(argv, capsys)[0] == 2                                   # not empty
    rc, _, err = run_cli([*argv, "--overwrite"], capsys)
    assert rc == 0 and (out / "vocab.txt").is_file(), err
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2 and "earlier `bertkit vocab` run" in err
    (out / "stale.txt").write_text("left by the earlier run")
    info = json.loads((out / MARKER).read_text())
    wrote = info.pop("wrote")
    assert "vocab.txt" in wrote and "notes.txt" not in wrote
    (out / MARKER).write_text(json.dumps(info))     # a run that crashed: all but the kept files are its own
    rc, _, err = run_cli([*argv, "--overwrite"], capsys)
    assert rc == 0, err
    assert not (out / "stale.txt").exists() and (out / "notes.txt").read_text() == "someone's notes"


def _vocab_argv(world, out, *extra):
    return ["vocab", "--files", str(world / "corpus.txt"), "--vocab-size", "60", "--out", str(out), "--no-progress",
            *extra]


@pytest.mark.parametrize("bad", [["--files", "nope.txt"], ["--vocab-size", "3"]])
def test_a_refused_overwrite_keeps_the_earlier_run(bad, world, tmp_path, capsys):
    out = tmp_path / "v"
    assert run_cli(_vocab_argv(world, out), capsys)[0] == 0
    before = _digest(out)
    argv = _vocab_argv(world, out, "--overwrite")
    argv[argv.index(bad[0]) + 1] = bad[1]
    rc, _, err = run_cli(argv, capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert _digest(out) == before and not (out / REPLACED).exists()


def test_overwrite_replaces_only_what_the_earlier_run_wrote(world, tmp_path, capsys):
    out = tmp_path / "v"
    assert run_cli(_vocab_argv(world, out), capsys)[0] == 0
    (out / "notes.txt").write_text("mine")          # added after the run: not the run's to delete
    (out / "vocab.txt").write_text("stale")
    rc, _, err = run_cli(_vocab_argv(world, out, "--overwrite"), capsys)
    assert rc == 0, err
    assert (out / "notes.txt").read_text() == "mine" and "the" in (out / "vocab.txt").read_text().split()
    assert not (out / REPLACED).exists()


def _failed_overwrite(out: Path, name: str = "model.txt") -> str:
    """A finished finetune run in `out` (model.txt = 'earlier'), then an --overwrite run that wrote `name` and
    failed: returns settle_out's note."""
    from bertkit.commands.checks import out_dir, settle_out
    out_dir(out, "finetune")
    (out / "model.txt").write_text("earlier")
    settle_out(out, True)
    out_dir(out, "finetune", overwrite=True)
    (out / name).write_text("half")
    return settle_out(out, False)


def test_a_run_that_fails_after_writing_keeps_the_replaced_run_aside(tmp_path):
    from bertkit.commands.checks import out_dir, settle_out
    out = tmp_path / "run"
    note = _failed_overwrite(out)
    assert REPLACED in note and (out / REPLACED / "model.txt").read_text() == "earlier"
    out_dir(out, "finetune", overwrite=True)        # the complete run stays the one to put back
    assert (out / REPLACED / "model.txt").read_text() == "earlier" and not (out / "model.txt").exists()
    assert settle_out(out, False) is None
    assert (out / "model.txt").read_text() == "earlier" and not (out / REPLACED).exists()
    assert settle_out(out, True) is None                # nothing of this process's to settle: left alone
    assert (out / "model.txt").read_text() == "earlier"


def test_settling_acts_only_on_what_this_command_set_up(tmp_path):
    """A PID can repeat (a container's PID 1, two commands in one process): a later command's success never takes
    the directory an earlier one left for its own, and --overwrite over someone else's files holds nothing aside."""
    from bertkit.commands.checks import out_dir, settle_out
    out = tmp_path / "run"
    assert REPLACED in _failed_overwrite(out)
    (out / "predictions.jsonl").write_text("{}")        # `predict --out run/` in the same process, then settled
    assert settle_out(out, True) is None and (out / REPLACED / "model.txt").read_text() == "earlier"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    out_dir(theirs, "vocab", overwrite=True)
    (theirs / "vocab.txt").write_text("half")
    assert settle_out(theirs, False) is None and not (theirs / REPLACED).exists()


def test_a_sibling_process_mid_check_is_not_content(tmp_path):
    """The ranks of one torchrun launch check --out at once: one rank's writability probe or marker still being
    written is not "not empty" to the other (it was, now and then, under load)."""
    from bertkit.commands.checks import out_dir
    out = tmp_path / "run"
    out.mkdir()
    (out / ".bertkit-probe-abc123").write_bytes(b"")
    (out / f".{MARKER}.tmp-4242").write_text("{")
    assert out_dir(out, "pretrain", reuse=True, dry_run=True) == out.resolve()
    assert out_dir(out, "vocab") == out.resolve()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / ".bertkit-probe-abc123").write_bytes(b"")
    (theirs / "mine.txt").write_text("x")
    with pytest.raises(Exception, match="not empty"):
        out_dir(theirs, "vocab")


def test_files_added_after_a_failed_run_survive_the_next_overwrite(tmp_path):
    """A failed run records what it wrote too: the next --overwrite deletes that, not a user's file added since."""
    from bertkit.commands.checks import out_dir, settle_out
    out = tmp_path / "run"
    assert REPLACED in _failed_overwrite(out, "half.txt")
    (out / "notes.txt").write_text("mine")
    out_dir(out, "finetune", overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and not (out / "half.txt").exists()
    settle_out(out, True)
    assert (out / "notes.txt").read_text() == "mine" and not (out / REPLACED).exists()


def test_a_users_folder_named_like_the_held_run_is_refused(tmp_path):
    from bertkit.commands.checks import OutputError, out_dir, settle_out
    out = tmp_path / "run"
    out_dir(out, "vocab")
    (out / "vocab.txt").write_text("earlier")
    settle_out(out, True)
    (out / REPLACED).mkdir()
    (out / REPLACED / "mine.txt").write_text("precious")
    with pytest.raises(OutputError, match="is not bertkit's"):
        out_dir(out, "vocab", overwrite=True)
    assert (out / REPLACED / "mine.txt").read_text() == "precious" and (out / "vocab.txt").read_text() == "earlier"


def test_a_file_the_run_rewrote_is_its_own_from_then_on(tmp_path):
    """A user's file the run wrote over (the same name) is the run's output now: the next --overwrite replaces it
    instead of keeping the old run's copy beside the new run."""
    from bertkit.commands.checks import out_dir, settle_out
    out = tmp_path / "run"
    out.mkdir()
    (out / "predictions_test.jsonl").write_text("{}")
    out_dir(out, "finetune", overwrite=True)
    (out / "predictions_test.jsonl").write_text('{"run": 1}')
    (out / "model.txt").write_text("run 1")
    settle_out(out, True)
    out_dir(out, "finetune", overwrite=True)
    assert not (out / "predictions_test.jsonl").exists() and not (out / "model.txt").exists()


def test_sigterm_puts_the_replaced_run_back(world, tmp_path):
    """SIGTERM (kill, a scheduler, timeout) ends the command through its finally: an --overwrite that had written
    nothing yet puts the earlier run back, as an error or Ctrl-C would."""
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "bertkit", "vocab", "--files", "-", "--vocab-size", "60", "--out", str(out),
            "--no-progress"]
    assert subprocess.run(base, input=(world / "corpus.txt").read_bytes(), env=env, timeout=120).returncode == 0
    before = _digest(out)
    proc = subprocess.Popen([*base, "--overwrite"], stdin=subprocess.PIPE, env=env)   # waits on stdin: nothing written
    deadline = time.time() + 60
    while not (out / REPLACED).exists() and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert _digest(out) == before


def test_a_crash_leaves_no_empty_output_behind(world, tmp_path, capsys, monkeypatch):
    from bertkit import vocab
    def bug(*a, **k):
        raise RuntimeError("a bug")
    monkeypatch.setattr(vocab, "learn_vocab", bug)
    out = tmp_path / "new" / "v"
    rc, _, _ = run_cli(_vocab_argv(world, out), capsys)
    assert str(rc).startswith("traceback") and not (tmp_path / "new").exists()


def test_attention_says_when_it_draws_part_of_the_text(world, tmp_path, capsys):
    rc, _, err = run_cli(["attention", str(world / "mlm"), "the man " * 100, "--out", str(tmp_path / "a")], capsys)
    assert rc == 0 and "the text is 202 tokens; the maps show its first 64" in err, err   # the model's positions


def test_attention_keeps_an_earlier_map_unless_overwrite(world, tmp_path, capsys):
    argv = ["attention", str(world / "mlm"), "the man", "--out", str(tmp_path / "a")]
    assert run_cli(argv, capsys)[0] == 0
    before = _digest(tmp_path / "a")
    rc, _, err = run_cli(argv[:2] + ["a man"] + argv[3:], capsys)
    assert rc == 2 and "attention_grid.png: exists; pass --overwrite" in err
    assert _digest(tmp_path / "a") == before
    assert run_cli(argv + ["--overwrite"], capsys)[0] == 0


def test_vocab_reads_stdin(world, tmp_path):
    import subprocess
    import sys
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    r = subprocess.run([sys.executable, "-m", "bertkit", "vocab", "--files", "-", "--vocab-size", "60", "--out",
                        str(tmp_path / "v"), "--no-progress"], input=(world / "corpus.txt").read_bytes(),
                       capture_output=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert {"the", "man"} <= set((tmp_path / "v" / "vocab.txt").read_text().split())


def test_attention_query_that_is_punctuation_stays_inside_out(world, tmp_path, capsys):
    rc, out, err = run_cli(["attention", str(world / "mlm"), "the man .", "--query", "[UNK]", "--out",
                            str(tmp_path / "a")], capsys)
    assert rc == 0, err
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [MARKER, "attention_from__UNK_.png", "attention_grid.png"]


def _file_size_limit(limit: int):
    """For a child process: writes past `limit` bytes fail with EFBIG (SIGXFSZ ignored), as a full disk would."""
    def apply():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("case", ["predict", pytest.param("embed", marks=pytest.mark.slow)])
def test_a_real_write_failure_in_a_child_process(case, world, tmp_path):
    """The whole path, not a mock: the kernel refuses the write, the CLI prints one line, exits 2, the earlier
    output is as it was and no temporary file is left."""
    import subprocess
    import sys
    out = tmp_path / ("p.jsonl" if case == "predict" else "v.jsonl")
    out.write_text("the earlier output\n")
    argv = {"predict": ["predict", "--model", str(world / "clf"), "--data", str(world / "data" / "dev.csv")],
            "embed": ["embed", str(world / "mlm"), "--file", str(world / "data" / "sents.txt")]}[case]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "bertkit", *argv, "--out", str(out), "--overwrite"], env=env,
                       capture_output=True, text=True, timeout=300, preexec_fn=_file_size_limit(256))
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "File too large" in lines[0], r.stderr[-3000:]
    assert out.read_text() == "the earlier output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


@pytest.mark.parametrize("exc, rc", [(MemoryError("Unable to allocate 58.2 TiB for an array"), 2),
                                     (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/x"), 2),
                                     (OSError(errno.EACCES, "Permission denied", "/root/x"), 2),
                                     (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), 2),
                                     (BrokenPipeError(errno.EPIPE, "Broken pipe"), 0)])
def test_last_resort_errors_are_one_line(exc, rc, world, capsys, monkeypatch):
    from bertkit.infer import Predictor

    def fail(*a, **k):
        raise exc
    monkeypatch.setattr(Predictor, "load", fail)
    got, _, err = run_cli(["fill-mask", str(world / "mlm"), "the [MASK]"], capsys)
    assert got == rc and len([ln for ln in err.splitlines() if ln.strip()]) == (rc == 2), err


def test_a_bug_keeps_its_traceback(world, capsys, monkeypatch):
    from bertkit.cli import main
    from bertkit.infer import Predictor

    def fail(*a, **k):
        raise RuntimeError("a bug")
    monkeypatch.setattr(Predictor, "load", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["fill-mask", str(world / "mlm"), "the [MASK]"])


def test_pretrain_config_from_stdin(world, tmp_path, capsys, monkeypatch):
    import io
    import sys
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((world / "mlm" / "config.json").read_bytes())))
    out = tmp_path / "run"
    rc, _, err = run_cli(["pretrain", str(world / "shards"), "--config", "-", "--out", str(out), "--steps", "1",
                          "--batch-size", "4", "--no-progress", "--precision", "fp32"], capsys)
    assert rc == 0, err[-2000:]
    assert json.loads((out / "config.stdin.json").read_text())["hidden_size"] == 32


# ------------------------------------------------------------------------------------------------ links, full disks

# every writing command: its argv (OUT: where the output goes) and the names it writes there ("": OUT is the file)
_TRAIN = ["--epochs", "1", "--quiet", "--fp32", "--batch-size", "8"]
_WRITERS = {
    "finetune": (["finetune", "--task", "classify", "--model", "W/mlm", "--train", "W/data/train.csv", "--dev",
                  "W/data/dev.csv", "--out", "OUT", *_TRAIN],
                 ["metrics.json", "summary.json", "predictions_dev.jsonl", "confusion_dev.png", "config.json",
                  "model.safetensors", "settings.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json"]),
    "distill": (["distill", "--teacher", "W/clf", "--student-layers", "1", "--train", "W/data/train.csv", "--dev",
                 "W/data/dev.csv", "--out", "OUT", *_TRAIN],
                ["metrics.json", "summary.json", "predictions_dev.jsonl", "confusion_dev.png", "config.json",
                 "model.safetensors", "vocab.txt"]),
    "evaluate": (["evaluate", "--model", "W/clf", "--data", "W/data/dev.csv", "--out", "OUT"],
                 ["metrics_dev.json", "predictions_dev.jsonl", "confusion_dev.png"]),
    "task-data": (["task-data", "sentiment", "--out", "OUT"], ["train.csv", "dev.csv", "test.csv", "stats.json"]),
    "vocab": (["vocab", "--files", "W/corpus.txt", "--vocab-size", "60", "--out", "OUT", "--no-progress"],
              ["vocab.txt", "tokenizer.json", "tokenizer_config.json"]),
    "prepare": (["prepare", "--corpus", "W/corpus.txt", "--vocab", "W/vocab", "--out", "OUT", "--seq-len", "32"],
                ["manifest.json", "vocab.txt", "w00-00000.done.json", "w00-00000.tokens.npy", "w00-00000.meta.npy"]),
    "pretrain": (["pretrain", "W/shards", "--preset", "tiny", "--out", "OUT", "--steps", "2", "--batch-size", "4",
                  "--precision", "fp32", "--no-progress"],
                 ["metrics.jsonl", "curves.png", "pretrain_config.json", "summary.json", "summary.md"]),
    "attention": (["attention", "W/mlm", "the man", "--out", "OUT"], ["attention_grid.png"]),
    "convert": (["convert", "W/tf", "OUT"], ["config.json", "model.safetensors", "vocab.txt", "tokenizer.json"]),
    "quantize": (["quantize", "W/clf", "OUT"], ["config.json", "model.safetensors", "settings.json", "vocab.txt"]),
    "predict": (["predict", "--model", "W/clf", "--data", "W/data/dev.csv", "--out", "OUT"], [""]),
    "plot-curves": (["plot", "W/run", "--out", "OUT"], [""]),
    "plot-confusion": (["plot", "W/data/preds.jsonl", "--confusion", "--out", "OUT"], [""]),
    "export": (["export", "W/mlm", "OUT", "--no-check"], [""]),
    "embed-npy": (["embed", "W/mlm", "--file", "W/data/sents.txt", "--out", "OUT"], [""]),
    "embed-jsonl": (["embed", "W/mlm", "--file", "W/data/sents.txt", "--out", "OUT"], [""]),
    "embed-index": (["embed", "W/mlm", "--file", "W/data/sents.txt", "--out", "OUT"],
                    ["manifest.json", "vectors.npy", "ids.npy", "texts.jsonl", "bertkit_source.json"]),
    "mine": (["mine", "W/mlm", "--data", "T/pairs.jsonl", "--out", "OUT"], [""]),
}
_SUFFIX = {"predict": ".jsonl", "plot-curves": ".png", "plot-confusion": ".png", "export": ".onnx", "embed-npy": ".npy",
           "embed-jsonl": ".jsonl", "mine": ".jsonl"}
_PAIRS = "".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in (
    ("the man", "the man is eating food"), ("a dog", "a dog run"), ("paris", "paris france")))


def _writer(cmd: str, w: Path, t: Path, out: Path, *extra) -> list[str]:
    (t / "pairs.jsonl").write_text(_PAIRS)
    return _paths([str(out) if a == "OUT" else a for a in _WRITERS[cmd][0]] + ["--overwrite", *extra], w, t)


def _scratch(cmd: str, w: Path, tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """(T, the output path) for a writer's run in tmp_path; an index command's output holds an earlier index."""
    t = tmp_path / "T"
    t.mkdir()
    monkeypatch.chdir(tmp_path)
    out = t / ("out" + _SUFFIX.get(cmd, ""))
    if cmd == "embed-index":
        shutil.copytree(w / "index", out)
    return t, out


@pytest.mark.parametrize("kind", ["hard", "symbolic"])
@pytest.mark.parametrize("cmd", list(_WRITERS))
def test_a_link_in_the_output_is_replaced_never_written_through(cmd, kind, world, tmp_path, capsys, monkeypatch):
    """Each name the command writes is a hard or symbolic link to a file outside --out: the command replaces the
    link with its own file and the link's target keeps its bytes."""
    t, out = _scratch(cmd, world, tmp_path, monkeypatch)
    names = _WRITERS[cmd][1]
    victims = {}
    for i, name in enumerate(names):
        target = out / name if name else out
        target.parent.mkdir(parents=True, exist_ok=True)
        victim = t / f"victim-{i}"
        victim.write_bytes(f"precious {i}\n".encode())
        target.unlink(missing_ok=True)
        os.link(victim, target) if kind == "hard" else target.symlink_to(victim)
        victims[victim] = victim.read_bytes()
    rc, _, err = run_cli(_writer(cmd, world, t, out), capsys)
    assert rc == 0, f"{cmd}: exit {rc}: {err[-2000:]}"
    for i, name in enumerate(names):
        victim, target = t / f"victim-{i}", out / name if name else out
        assert victim.read_bytes() == victims[victim], f"{cmd}: wrote through the {kind} link {name or out.name}"
        assert not target.is_symlink() and not target.samefile(victim), f"{cmd}: {name} is still the link"


def _fail_commit(*args, **kwargs):
    """os.replace of a temp file or staged directory into place: the disk is full (half the bytes written)."""
    src = Path(args[0])
    if MARKER + ".tmp" in src.name:         # the run's record (test_a_full_disk_before_the_run_begins)
        return _REAL_REPLACE(*args, **kwargs)
    if ".tmp-" in src.name or src.parent.name.startswith(".bertkit-tmp") or src.name.startswith(".bertkit-tmp"):
        if src.is_file():
            src.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(args[1]))
    return _REAL_REPLACE(*args, **kwargs)


_REAL_REPLACE = os.replace


def _fail_safetensors(tensors, filename, *a, **k):
    Path(filename).write_bytes(b"half")
    import safetensors
    raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def _fail_torch_save(obj, f, *a, **k):
    Path(f).write_bytes(b"half")
    raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file "
                       "data/0: file write failed")


def _fail_np_save(file, *a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


_SAFETENSORS = ("finetune", "distill", "convert", "quantize", "pretrain")
_FULL_DISKS = ([(c, "commit") for c in _WRITERS] + [(c, "safetensors") for c in _SAFETENSORS]
               + [("pretrain", "torch.save"), ("prepare", "np.save"), ("embed-npy", "np.save"),
                  ("embed-index", "np.save")])


@pytest.mark.parametrize("cmd, how", _FULL_DISKS, ids=[f"{c}-{h}" for c, h in _FULL_DISKS])
def test_a_full_disk_under_every_writer(cmd, how, world, tmp_path, capsys, monkeypatch):
    """The disk fills while the command writes its output: one line, exit 2, the earlier output as it was, no temp
    file or half a file left."""
    import numpy as np
    import safetensors.torch
    import torch
    t, out = _scratch(cmd, world, tmp_path, monkeypatch)
    if cmd in _SUFFIX:
        out.write_bytes(b"the earlier output")
    elif cmd != "embed-index":          # (an index: the earlier one is there already)
        out.mkdir()
        (out / MARKER).write_text(json.dumps({"command": _WRITERS[cmd][0][0]}))
        (out / "earlier.txt").write_text("the earlier run")
    before = _digest(out) if out.is_dir() else out.read_bytes()
    target = {"commit": (os, "replace", _fail_commit), "safetensors": (safetensors.torch, "save_file", _fail_safetensors),
              "torch.save": (torch, "save", _fail_torch_save), "np.save": (np, "save", _fail_np_save)}[how]
    monkeypatch.setattr(*target)
    rc, _, err = run_cli(_writer(cmd, world, t, out), capsys)
    monkeypatch.undo()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "space" in lines[0].lower(), f"{cmd}/{how}: exit {rc}: {err[-3000:]}"
    assert (_digest(out) if out.is_dir() else out.read_bytes()) == before, f"{cmd}/{how}: the earlier output changed"
    left = [p for p in tmp_path.rglob("*") if "tmp" in p.name or p.name.startswith(".bertkit-tmp")]
    assert not left, f"{cmd}/{how}: left {left}"


# the Python API with hostile arguments: a bertkit error naming the argument, never a TypeError / torch error
_API = {
    "load-int": lambda bk, w: bk.load(123),
    "load-none": lambda bk, w: bk.load(None),
    "pipeline-model-bytes": lambda bk, w: bk.pipeline("fill-mask", b"/tmp"),
    "fill-top-k-negative": lambda bk, w: bk.pipeline("fill-mask", w / "mlm")("the [MASK]", top_k=-1),
    "fill-top-k-text": lambda bk, w: bk.pipeline("fill-mask", w / "mlm")("the [MASK]", top_k="3"),
    "fill-batch-size-0": lambda bk, w: bk.pipeline("fill-mask", w / "mlm")(["the [MASK]"], batch_size=0),
    "fill-batch-size-none": lambda bk, w: bk.pipeline("fill-mask", w / "mlm")(["the [MASK]"], batch_size=None),
    "fill-top-k-bool": lambda bk, w: bk.pipeline("fill-mask", w / "mlm")("the [MASK]", top_k=True),
    "encode-batch-size-bool": lambda bk, w: bk.Predictor.load(w / "mlm").sentence_encoder().encode(
        bk.Tokenizer.from_pretrained(w / "mlm"), ["a dog"], batch_size=True),
    "predictor-device": lambda bk, w: bk.Predictor.load(w / "clf", device="banana"),
    "encode-batch-size-negative": lambda bk, w: bk.Predictor.load(w / "mlm").sentence_encoder().encode(
        bk.Tokenizer.from_pretrained(w / "mlm"), ["a dog"], batch_size=-1),
}


@pytest.mark.parametrize("name", list(_API))
def test_the_api_refuses_hostile_arguments_in_one_line(name, world):
    import bertkit
    with pytest.raises(bertkit.BertkitError) as e:
        _API[name](bertkit, world)
    assert "\n" not in str(e.value)


def test_the_campaign_counts(capsys):
    from bertkit.cli import build_parser  # noqa: F401 - the campaign's parser builds
    n = len(ALL) + len(SERVE) + 2 * len(_WRITERS) + len(_FULL_DISKS) + 1 + len(_PIPED) + len(_API)
    print(f"campaign: {n} probes (links {2 * len(_WRITERS)}, full disks {len(_FULL_DISKS) + 1}, pipes read "
          f"{len(_PIPED)}, API {len(_API)})")
    assert n > 450


def test_a_full_disk_before_the_run_begins(world, tmp_path, capsys, monkeypatch):
    """The disk is full when --overwrite records the new run: the earlier run, set aside a moment before, is back."""
    out = tmp_path / "v"
    assert run_cli(_vocab_argv(world, out), capsys)[0] == 0
    before = _digest(out)

    def full(src, dst):
        if MARKER + ".tmp" in Path(src).name:
            raise OSError(errno.ENOSPC, "No space left on device", str(dst))
        return _REAL_REPLACE(src, dst)
    monkeypatch.setattr(os, "replace", full)
    rc, _, err = run_cli(_vocab_argv(world, out, "--overwrite"), capsys)
    monkeypatch.undo()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "No space left" in err, err
    assert _digest(out) == before


class _PipeWriter:
    """Feeds `data` to the named pipe `path` each time a reader opens it (as `<(...)` would, once), until stopped."""

    def __init__(self, path: Path, data: bytes):
        import threading
        self.path, self.data, self.done = path, data, False
        os.mkfifo(path)
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()

    def _feed(self):
        while not self.done:
            try:
                with open(self.path, "wb") as f:     # waits for a reader
                    if not self.done:
                        f.write(self.data)
            except OSError:                          # the reader left early (a refusal after a peek)
                pass

    def stop(self):
        self.done = True
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)      # releases a writer still waiting for a reader
        os.close(fd)
        self.thread.join(timeout=10)


_CSV = b"text,label\nthe film was great,pos\nthe plot was awful,neg\n"
_PIPED = {      # P: the named pipe; what is written into it
    "embed": (["embed", "W/mlm", "--file", "P"], b"the man\na dog run\n"),
    "fill-mask": (["fill-mask", "W/mlm", "--file", "P"], b"the [MASK]\n"),
    "tokenize": (["tokenize", "--vocab", "W/vocab/vocab.txt", "--file", "P"], b"the man\n"),
    "vocab": (["vocab", "--files", "P", "--vocab-size", "60", "--out", "T/v", "--no-progress"], b"the man is\n" * 50),
    "prepare": (["prepare", "--corpus", "P", "--vocab", "W/vocab", "--out", "T/s", "--seq-len", "32"], b"the man\n"),
    "predict": (["predict", "--model", "W/clf", "--data", "P", "--out", "T/p.jsonl"], _CSV),
    "evaluate": (["evaluate", "--model", "W/clf", "--data", "P"], _CSV),
    "finetune": (["finetune", "--task", "classify", "--model", "W/mlm", "--train", "P", "--dev", "W/data/dev.csv",
                  "--out", "T/f", *_TRAIN], _CSV),
    "plot": (["plot", "P", "--confusion", "--out", "T/c.png"], b'{"label": "pos", "prediction": "neg"}\n'),
    "pretrain": (["pretrain", "W/shards", "--config", "P", "--out", "T/r", "--steps", "1", "--no-progress"], b"{}"),
    "mine": (["mine", "W/mlm", "--data", "P", "--out", "T/m.jsonl"], _PAIRS.encode()),
    "embed-binary": (["embed", "W/mlm", "--file", "P"], BINARY),
}


@pytest.mark.parametrize("cmd", list(_PIPED))
def test_a_named_pipe_as_an_input(cmd, world, tmp_path, capsys, monkeypatch):
    """A pipe for an input file (`<(...)`, mkfifo): the command reads it or refuses it in one line; it never hangs,
    never raises and never changes an input."""
    monkeypatch.chdir(tmp_path)
    t = tmp_path / "T"
    t.mkdir()
    argv, data = _PIPED[cmd]
    pipe = _PipeWriter(tmp_path / "pipe", data)
    before = _digest(world)
    try:
        rc, _, err = run_cli([str(pipe.path) if a == "P" else a for a in _paths(argv, world, t)], capsys)
    finally:
        pipe.stop()
    lines = [ln for ln in err.splitlines() if ln.strip() and "error" in ln]
    assert rc in (0, 2), f"{cmd}: {rc}: {err[-2000:]}"
    assert rc == 0 or len(lines) == 1, f"{cmd}: {err[-2000:]}"
    assert _digest(world) == before


def test_a_preset_model_gets_a_word_table_the_size_of_its_vocab(world, tmp_path, capsys):
    rc, _, err = run_cli(["finetune", "--task", "classify", "--model", "tiny", "--vocab", str(world / "vocab"),
                          "--train", str(world / "data" / "train.csv"), "--dev", str(world / "data" / "dev.csv"),
                          "--out", str(tmp_path / "f"), *_TRAIN], capsys)
    assert rc == 0, err[-2000:]
    rows = len((world / "vocab" / "vocab.txt").read_text().split())
    assert json.loads((tmp_path / "f" / "config.json").read_text())["vocab_size"] == rows == 22


@pytest.mark.parametrize("left", [{}, {".plan.json.tmp-77": b"{"}, {"part-00000.npy": b"x", ".part-00001.npy.tmp-7": b""}])
def test_a_parts_folder_a_killed_index_build_left_is_started_afresh(left, tmp_path):
    """Killed before its plan.json was written, or while the finished index removed its parts: bertkit's own
    leftovers, cleared for the new plan (a user's folder of that name is refused: beside_out_probes)."""
    from bertkit.commands.embed import _keep_parts
    parts = tmp_path / ".o.parts"
    parts.mkdir()
    for name, data in left.items():
        (parts / name).write_bytes(data)
    _keep_parts(parts, {"rows": 4})
    assert sorted(p.name for p in parts.iterdir()) == ["plan.json"]
    assert json.loads((parts / "plan.json").read_text()) == {"rows": 4}


def test_a_json_count_past_a_floats_range_is_a_count():
    """Hand-edited numbers in plan.json / state.json / a shard manifest: an int of 400 digits is a count (not an
    OverflowError from math.isfinite); NaN and a fraction where a count belongs are refused naming the field."""
    from bertkit.errors import DataError
    from bertkit.textfiles import check_fields
    check_fields({"elapsed": 10 ** 400, "step": 10 ** 400}, {"elapsed": "number", "step": "count"}, "state.json")
    for bad in ({"elapsed": float("nan")}, {"step": 1.5}, {"step": True}):
        with pytest.raises(DataError, match=f"state.json: {next(iter(bad))}"):
            check_fields(bad, {"elapsed": "number", "step": "count"}, "state.json", required=False)


def test_index_texts_with_unicode_line_separators_read_back(tmp_path):
    """texts.jsonl is written with ensure_ascii=False, so U+2028 / U+2029 / U+0085 stay raw in it: only newlines
    separate its records."""
    from bertkit.commands.embed import INDEX_TEXTS, _index_texts
    texts = ["a\u2028b", "c\u2029d\x85e"]
    (tmp_path / INDEX_TEXTS).write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts),
                                        encoding="utf-8")
    assert _index_texts(tmp_path, 2) == texts


@pytest.mark.parametrize("encoding,loads", [("utf-8", True), ("utf-8-sig", True), ("utf-16", False)])
def test_every_json_file_is_read_by_one_encoding_rule(encoding, loads, tmp_path):
    """config.json (through read_json_config) and tokenizer JSON (read_json_object): UTF-8, a byte-order mark
    tolerated, anything else refused in one line naming the file."""
    from bertkit.config import read_json_config
    from bertkit.errors import BertkitError
    from bertkit.tokenizer.hfjson import read_json_object
    path = tmp_path / "config.json"
    path.write_bytes(json.dumps({"do_lower_case": True}).encode(encoding))
    for read in (read_json_config, read_json_object):
        if loads:
            assert read(path) == {"do_lower_case": True}
        else:
            with pytest.raises(BertkitError, match="config.json: not UTF-8"):
                read(path)
