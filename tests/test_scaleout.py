"""Pre-training on several processes and nodes, on CPU (gloo, fp32, no dropout): FSDP2 gives the per-step losses
and the final weights of DDP; torchrun with 2 nodes x 1 process (c10d rendezvous on loopback, two launchers)
gives the losses of 1 node x 2 processes; a 2-node run killed (SIGKILL) after its last checkpoint resumes from it
and ends with the losses and weights of the run never stopped; `embed` on 2 processes writes the vectors (a file, or
an index built in parts) of one, and an index interrupted mid-way is finished by a rerun from its parts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from test_embed_cli import WORDS, data as embed_data, tiny_st  # noqa: F401  (a tiny sentence encoder, 8 lines)
from test_finetune_resume import CHILD as WORKER  # `bertkit ARGS`, killed by SIGKILL after $KILL_AT steps
from test_train_pretrain import data  # noqa: F401  (the same tiny shards)

SRC = str(Path(__file__).resolve().parents[1] / "src")
COMMON = ["--preset", "tiny", "--precision", "fp32", "--no-progress", "--dropout", "0", "--steps", "4", "--lr",
          "1e-3", "--warmup", "0", "--save-every", "2", "--batch-size", "4"]

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp: Path, out: Path, *more: str, nodes: int = 1, kill_at: int = 0) -> list[int]:
    """`bertkit pretrain` of the shards on 2 processes (see _launch)."""
    return _launch(tmp, out.name, ["pretrain", str(tmp / "shards"), "--out", str(out), *COMMON, *more], nodes,
                   kill_at)


def _launch(tmp: Path, name: str, args: list[str], nodes: int = 1, kill_at: int = 0) -> list[int]:
    """`bertkit ARGS` on 2 processes: one launcher (--standalone) or `nodes` launchers of one process each that
    meet through a c10d rendezvous on 127.0.0.1; the launchers' exit codes."""
    worker = tmp / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILL_AT": str(kill_at), "LOSSES": str(tmp / f"{name}.losses"),
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    where = (["--standalone", "--nproc-per-node", "2"] if nodes == 1 else
             ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
              f"127.0.0.1:{_free_port()}", "--rdzv-id", name, "--local-addr", "127.0.0.1"])
    cmd = [sys.executable, "-m", "torch.distributed.run", *where, str(worker), *args]
    logs = [tmp / f"{name}-{i}.log" for i in range(nodes)]    # files: a full pipe would stall a launcher
    procs = []
    for log in logs:
        with open(log, "a") as f:
            procs.append(subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=300) for p in procs]
    if kill_at == 0:
        assert codes == [0] * nodes, "\n".join(log.read_text()[-3000:] for log in logs)
    return codes


def _losses(run: Path) -> list[tuple[int, int, float]]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["tokens"], r["loss"]) for r in recs if r["split"] == "train"]


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(run / "model" / "model.safetensors"))


@pytest.fixture(scope="module")       # each pre-training run is a torchrun launch: ~20 s on 2 loaded cores
def runs(data, tmp_path_factory):  # noqa: F811
    """The reference runs: 1 node x 2 processes (DDP), and 2 nodes x 1 process."""
    tmp = tmp_path_factory.mktemp("scaleout")
    (tmp / "shards").symlink_to(data / "shards")
    _torchrun(tmp, tmp / "ddp")
    _torchrun(tmp, tmp / "nodes", nodes=2)
    return tmp


@pytest.mark.slow
def test_fsdp_gives_the_losses_and_weights_of_ddp(runs):
    _torchrun(runs, runs / "fsdp", "--fsdp")
    ddp, fsdp = _losses(runs / "ddp"), _losses(runs / "fsdp")
    assert [r[:2] for r in fsdp] == [r[:2] for r in ddp] and len(ddp) == 4
    assert [r[2] for r in fsdp] == pytest.approx([r[2] for r in ddp], rel=1e-5)
    a, b = _weights(runs / "ddp"), _weights(runs / "fsdp")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


@pytest.mark.slow
def test_two_nodes_give_the_losses_of_one_node_of_two_processes(runs):
    ddp, nodes = _losses(runs / "ddp"), _losses(runs / "nodes")
    assert [r[:2] for r in nodes] == [r[:2] for r in ddp] and len(ddp) == 4
    assert [r[2] for r in nodes] == pytest.approx([r[2] for r in ddp], rel=1e-5)
    # one process per node: every global rank wrote its own data position + RNG state
    ckpt = runs / "nodes" / "checkpoints" / "step-00000004"
    assert (ckpt / "rank-00000.pt").exists() and (ckpt / "rank-00001.pt").exists()


@pytest.mark.slow
def test_a_killed_two_node_run_resumes_exactly(runs):
    out = runs / "killed"
    codes = _torchrun(runs, out, nodes=2, kill_at=3)       # killed after step 3: the checkpoint at step 2 is the last
    assert codes != [0, 0] and not (out / "model").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002"]
    _torchrun(runs, out, "--resume", nodes=2)
    assert _losses(out) == _losses(runs / "nodes")
    a, b = _weights(runs / "nodes"), _weights(out)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_embed_on_two_processes_writes_the_vectors_of_one(tiny_st, embed_data, tmp_path):  # noqa: F811
    """Each rank encodes its share of the lines; rank 0 writes them all, in order."""
    from bertkit.cli import main as cli
    args = ["embed", str(tiny_st), "--file", str(embed_data / "docs.txt"), "--batch-size", "3", "--fp32"]
    assert cli([*args, "--out", str(tmp_path / "one.npy")]) == 0
    _launch(tmp_path, "embed", [*args, "--out", str(tmp_path / "two.npy")])
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert one.shape == two.shape == (8, one.shape[1])
    assert np.abs(one - two).max() <= 1e-6


def _docs(tmp: Path, n: int) -> Path:
    """`n` lines of 3 to 8 words: at --batch-size 1, one index part (embed.PART_BATCHES batches) every 64 lines."""
    rng = np.random.default_rng(1)
    path = tmp / "many.txt"
    path.write_text("".join(" ".join(rng.choice(WORDS, rng.integers(3, 9))) + "\n" for _ in range(n)))
    return path


@pytest.fixture
def one_thread():
    """A tiny model in this process: one torch thread is ~10x faster than two on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _index(path: Path):
    from bertkit.embed.index import EmbeddingIndex
    index = EmbeddingIndex.open(path)
    return np.asarray(index.vectors), list(index.ids), index.manifest


def test_an_index_on_two_processes_holds_the_vectors_of_one(tiny_st, tmp_path, one_thread):  # noqa: F811
    """Four parts (64, 64, 64, 8 lines), two a rank, each written by its rank; rank 0 writes the one index."""
    from bertkit.cli import main as cli
    args = ["embed", str(tiny_st), "--file", str(_docs(tmp_path, 200)), "--batch-size", "1", "--fp32", "--dtype",
            "float32", "--no-progress"]
    assert cli([*args, "--out", str(tmp_path / "one")]) == 0
    _launch(tmp_path, "embed", [*args, "--out", str(tmp_path / "two")])
    (one, one_ids, a), (two, two_ids, b) = _index(tmp_path / "one"), _index(tmp_path / "two")
    assert one.shape == two.shape == (200, one.shape[1]) and one_ids == two_ids == [str(i) for i in range(200)]
    assert np.abs(one - two).max() <= 1e-6 and a == b
    assert not (tmp_path / ".two.parts").exists() and (tmp_path / "two" / "texts.jsonl").is_file()


def test_an_interrupted_index_is_finished_from_its_parts(tiny_st, tmp_path, monkeypatch, one_thread):  # noqa: F811
    """A run stopped after its first part leaves that part beside the index; the rerun encodes only the other
    parts and writes the index of an uninterrupted run; parts of another model are not reused."""
    from bertkit.cli import main as cli
    from bertkit.embed.pooling import SentenceEncoder
    args = ["embed", str(tiny_st), "--file", str(_docs(tmp_path, 150)), "--batch-size", "1", "--fp32", "--dtype",
            "float32", "--no-progress"]
    assert cli([*args, "--out", str(tmp_path / "whole")]) == 0
    encode, calls = SentenceEncoder.encode, []

    def stopping(self, tok, texts, *a, **kw):
        calls.append(len(texts))
        if len(calls) == 2 and stop:
            raise KeyboardInterrupt         # the second part: as a kill, nothing after it runs
        return encode(self, tok, texts, *a, **kw)
    monkeypatch.setattr(SentenceEncoder, "encode", stopping)
    stop = True
    assert cli([*args, "--out", str(tmp_path / "index")]) != 0
    parts = tmp_path / ".index.parts"
    assert sorted(p.name for p in parts.iterdir()) == ["part-00000.npy", "plan.json"]
    assert not (tmp_path / "index").exists()
    stop, calls[:] = False, []
    assert cli([*args, "--out", str(tmp_path / "index")]) == 0
    assert calls == [64, 22]                    # parts 1 and 2; part 0 was done
    (got, got_ids, _), (want, want_ids, _) = _index(tmp_path / "index"), _index(tmp_path / "whole")
    assert np.array_equal(got, want) and got_ids == want_ids
    assert not parts.exists()
    stop, calls[:] = True, []                   # again, then parts of another model: all encoded anew
    assert cli([*args, "--out", str(tmp_path / "index"), "--overwrite"]) != 0
    plan = json.loads((parts / "plan.json").read_text())
    (parts / "plan.json").write_text(json.dumps({**plan, "model_hash": "sha256:another"}))
    stop, calls[:] = False, []
    assert cli([*args, "--out", str(tmp_path / "index"), "--overwrite"]) == 0 and calls == [64, 64, 22]
