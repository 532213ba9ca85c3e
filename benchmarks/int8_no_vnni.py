"""int8 without VNNI, emulated on a CPU that has it: bertkit fp32 against bertkit int8 with oneDNN held to AVX2.

    .venv/bin/python benchmarks/int8_no_vnni.py [--sentences 256] [--threads 2]

Sets ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2 and ATEN_CPU_CAPABILITY=avx2 before torch loads, runs the
int8 layers through oneDNN only (fbgemm has no switch that holds it to AVX2) with 7-bit activations (what
runtime.int8 does where there is no VNNI), and measures the int8 probe's cases under that emulation (its own probe
cache directory). MiniLM-L6 on BBC sentences at batch 32 and batch 1, three models interleaved: fp32, int8, and int8
with the plan's short-input rule (inputs under int8_float_below rows through the float GEMM, where the probe's
short case lost). One JSON line per batch size: sequences/s and the ratios to fp32, then the probe's figures.
Only an emulation: a real AVX2 CPU differs in clock, caches and fbgemm's kernels.
"""

from __future__ import annotations

import os

os.environ.update(ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="AVX2", ATEN_CPU_CAPABILITY="avx2")

import argparse  # noqa: E402
import copy  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import bbc_sentences  # noqa: E402
from quantize import batches_of, emit  # noqa: E402

from bertkit import runtime  # noqa: E402
from bertkit.datasets import minilm_dir  # noqa: E402
from bertkit.hardware import cpu_model  # noqa: E402
from bertkit.model import BertModel  # noqa: E402
from bertkit.runtime import int8, probe  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=256, help="texts per repeat at batch 32 (1/4 at batch 1)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["BERTKIT_CACHE"] = tempfile.mkdtemp(prefix="bertkit-novnni-")   # emulated probes stay out of the cache
    int8._vnni = lambda: False                      # 7-bit activations, as runtime.int8 runs without VNNI
    int8.ENGINES = ("onednn",)
    measured = probe._probe_int8_linear()
    below = runtime.int8_float_below(measured)     # the plan's rule on the emulated probe
    d = minilm_dir()
    fp32 = runtime.freeze(BertModel.from_pretrained(d))
    plain = runtime.freeze(int8.quantize(BertModel.from_pretrained(d)))
    guarded = copy.deepcopy(plain)
    int8.set_engine(plain, "onednn")
    int8.set_engine(guarded, "onednn", float_below=below, float_packed=runtime.plan().packed_dtypes)
    models = {"bertkit_fp32": fp32, "bertkit_int8": plain, "bertkit_int8_short_rule": guarded}
    texts = bbc_sentences(args.sentences)
    records = []
    for batch in (32, 1):
        batches = batches_of(d, texts if batch == 32 else texts[:max(1, args.sentences // 4)], batch)
        n = sum(b["input_ids"].shape[0] for b in batches)

        def run(m):
            with torch.inference_mode():
                for b in batches:
                    m(**b)
        for m in models.values():
            run(m)
        times = {k: [] for k in models}
        for r in range(args.repeats):
            for name in (list(models) if r % 2 == 0 else list(reversed(models))):
                t0 = time.perf_counter()
                run(models[name])
                times[name].append(time.perf_counter() - t0)
        sps = {k: round(n / statistics.median(v), 1) for k, v in times.items()}
        records.append(emit({"case": "int8-no-vnni-emulated", "model": "minilm", "batch": batch, "sequences": n,
                             "seq_per_s": sps,
                             "ratios": {"int8_vs_fp32": round(sps["bertkit_int8"] / sps["bertkit_fp32"], 2),
                                        "int8_short_rule_vs_fp32": round(sps["bertkit_int8_short_rule"]
                                                                         / sps["bertkit_fp32"], 2)},
                             "cpu": cpu_model(), "aten": torch.backends.cpu.get_cpu_capability(),
                             "threads": args.threads}))
    emit({"case": "probe", "int8_linear_onednn_avx2": {k: round(v * 1e3, 3) if isinstance(v, float) else v
                                                        for k, v in measured.items()},
          "int8_float_below": below, "cpu": cpu_model()})


if __name__ == "__main__":
    main()
