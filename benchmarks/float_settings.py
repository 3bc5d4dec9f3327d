"""Which settings change the floating-point results of the kernels the labs use (make test-other-cpu's choice).

    .venv/bin/python benchmarks/float_settings.py [--setting NAME=VALUE ...]

Each setting runs the same seeded computations in a fresh process: an MKL matmul and its gradient, ATen
reductions and elementwise functions (sum, sigmoid, exp, log_softmax, BCE), nn.EmbeddingBag, fbgemm's
table-batched embedding forward and its fused exact-Adagrad update, and fbgemm's INT8 inference lookup. It
prints, per kernel, whether the result's bytes differ from a run without the setting ("moved") or not.
A setting that moves nothing the labs compute is no use for simulating another CPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

DEFAULT_SETTINGS = [
    "ATEN_CPU_CAPABILITY=avx2", "ATEN_CPU_CAPABILITY=default", "MKL_CBWR=COMPATIBLE", "MKL_ENABLE_INSTRUCTIONS=AVX2",
    "ONEDNN_MAX_CPU_ISA=AVX2", "FBGEMM_ENABLE_INSTRUCTIONS=AVX2", "FBGEMM_NO_ASMJIT=1", "OMP_NUM_THREADS=1",
]


def fingerprints() -> dict[str, str]:
    """A short hash of each kernel's result (run in the child process)."""
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    def digest(tensor: torch.Tensor) -> str:
        return hashlib.sha1(tensor.detach().contiguous().numpy().tobytes()).hexdigest()[:8]

    torch.manual_seed(0)
    found = {}
    x, w = torch.randn(512, 37), torch.randn(61, 37, requires_grad=True)
    y = torch.nn.functional.linear(x, w)
    y.sum().backward()
    found["matmul (MKL)"], found["matmul gradient"] = digest(y), digest(w.grad)
    v = torch.randn(100_003)
    found["sum"], found["sigmoid"], found["exp"] = digest(v.sum()), digest(torch.sigmoid(v)), digest(torch.exp(v))
    found["log_softmax"] = digest(torch.log_softmax(v, 0))
    found["BCE with logits"] = digest(torch.nn.functional.binary_cross_entropy_with_logits(v, (v > 0).float()))
    ids, offsets = torch.randint(0, 1000, (4000,)), torch.arange(0, 4001, 8)
    bags = torch.nn.EmbeddingBag(1000, 36, mode="sum")
    found["nn.EmbeddingBag"] = digest(bags(ids, offsets[:-1]))
    tbe = SplitTableBatchedEmbeddingBagsCodegen([(1000, 36, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                optimizer=EmbOptimType.EXACT_ADAGRAD, learning_rate=0.1)
    pooled = tbe(ids, offsets)
    found["fbgemm TBE forward"] = digest(pooled)
    (pooled * pooled).sum().backward()
    found["fbgemm TBE + fused Adagrad"] = digest(tbe.split_embedding_weights()[0])
    int8 = IntNBitTableBatchedEmbeddingBagsCodegen([("t", 1000, 64, SparseType.INT8, EmbeddingLocation.HOST)], device="cpu")
    int8.fill_random_weights()
    found["fbgemm INT8 lookup"] = digest(int8(ids.int(), offsets.int()))
    return found


def run(setting: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if setting:
        name, _, value = setting.partition("=")
        env[name] = value
    done = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"{setting or 'no setting'}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", nargs="+", default=DEFAULT_SETTINGS, help="NAME=VALUE environment settings")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(fingerprints()))
        return
    baseline = run(None)
    for setting in opts.setting:
        moved = [kernel for kernel, value in run(setting).items() if value != baseline[kernel]]
        print(f"{setting:<34} moves: {', '.join(moved) if moved else 'nothing'}")


if __name__ == "__main__":
    main()
