"""Leaving the process group: a run under torchrun closes the group it opened before the interpreter exits (left
open, gloo's threads can abort a finished worker with SIGABRT), except when an uncaught exception ends the
process, where closing could wait on peers that never come."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

# an exit hook registered before bertkit's runs after it (last in, first out): it sees what bertkit's left; it writes
# its line in one os.write, since the two workers share the pipe and print's text and newline may interleave
SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    import torch, torch.distributed as dist
    atexit.register(lambda: os.write(1, f"rank {os.environ['RANK']} open at exit: {dist.is_initialized()}\\n".encode()))
    from bertkit.train.distributed import Dist
    d = Dist.setup("cpu")
    assert d.world == 2 and float(d.all_reduce_sum(torch.ones(1))) == 2.0
    if sys.argv[1] == "crash":
        raise RuntimeError("planted")
""")


def _run(tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    script = tmp_path / "leave.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), mode], env=env, capture_output=True, text=True, timeout=300)


def test_a_finished_torchrun_worker_closes_its_group_before_exit(tmp_path):
    proc = _run(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(line for line in proc.stdout.splitlines() if "open at exit" in line) == [
        "rank 0 open at exit: False", "rank 1 open at exit: False"]
    assert "terminate called" not in proc.stderr


def test_a_crashed_worker_leaves_its_group_alone(tmp_path):
    """The crash rule without torchrun: a one-process gloo group, closed at exit only when no exception is up."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent(f"""
        import sys
        import torch.distributed as dist
        from bertkit.train.distributed import _close_group
        for crashed in (True, False):
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
            if crashed:
                sys.last_value = RuntimeError("planted")
            _close_group()
            print(crashed, dist.is_initialized())
            if dist.is_initialized():
                dist.destroy_process_group()
            sys.__dict__.pop("last_value", None)
    """)
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "True", "False", "False"]
