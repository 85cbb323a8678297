"""A Llama trained on several GPUs under torch.compile: FSDP2 (``fully_shard``) or 2-way
tensor parallelism (``parallelize_module``), variants with and without CUTEDSL, with and
without Inductor's distributed autotuning (docs/distributed.md).

    python -m benchmarks.distributed_llama --parallel fsdp --gpus 2 [--layers 8] \
        [--variants fp32,bf16,aten,cutedsl] [--steps 10] [--out DIR]

The model is Llama-3-8B's layers (hidden 4096, SwiGLU MLP of 14336, 32 heads, 8 KV heads,
RoPE, RMSNorm; bf16, random weights, seed 0) in plain torch, with a smaller vocabulary
(``--vocab``, 32768) so that the embedding and the LM head, which run outside the compiled
blocks, stay small. Each block is compiled on its own (``nn.Module.compile``, mode
max-autotune-no-cudagraphs), after tensor parallelism and before FSDP, as torchtitan
does; the embedding, the final norm and the LM head run eagerly. One process per GPU
(torch.multiprocessing, as torchrun starts them; NCCL, ``NCCL_NVLS_ENABLE=0``), each
running every variant in turn on the same batch (FSDP: a batch per rank), in a fresh
dynamo state: a variant's first step (forward, cross-entropy, backward) is its cold
compile, then ``--steps`` steps of SGD are timed (the median). Each rank writes
``rank<r>.json``: per variant the losses, the first step's seconds, the median step's,
the relative errors of the loss and of the gradients (gathered whole) against the first
variant's (``bench.model_workloads.rel_error``), our kernels named in its output code and
the CuTe kernels it compiled itself (compile workers off, so that this process compiles).

Variants (``VARIANTS``): ``fp32``/``bf16`` eager; ``aten`` max-autotune with ATen's GEMMs
alone (the run without CUTEDSL); ``triton`` max-autotune's default backends (ATen,
Triton); ``cutedsl`` ATen and ours, with Inductor's distributed autotuning
(``TORCHINDUCTOR_DISTRIBUTED_MAX_AUTOTUNE_GEMM``) and ``config.distributed_autotune``;
``cutedsl-local`` the same with every rank autotuning every GEMM.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MODE = "max-autotune-no-cudagraphs"


@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int = 8
    vocab: int = 32768
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    batch: int = 2  # sequences per rank
    seq: int = 1024


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    dtype: torch.dtype = torch.bfloat16
    backends: str | None = None  # max-autotune's GEMM backends; None: eager
    distributed: bool = False  # Inductor's distributed autotuning, ours taking part


VARIANTS = {v.name: v for v in (
    Variant("fp32", torch.float32), Variant("bf16"), Variant("aten", backends="ATEN"),
    Variant("triton", backends="ATEN,TRITON"),
    Variant("cutedsl", backends="ATEN,CUTEDSL", distributed=True),
    Variant("cutedsl-local", backends="ATEN,CUTEDSL"))}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


def rotate(x: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    """RoPE over (batch, seq, heads, head_dim), the two halves of each head rotated."""
    seq, half = x.shape[1], x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), freqs)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention; the head counts follow the projections' widths, so a
    tensor-parallel rank computes its share of the heads."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.head_dim = shape.hidden // shape.heads
        self.groups = shape.heads // shape.kv_heads
        self.q = nn.Linear(shape.hidden, shape.heads * self.head_dim, bias=False)
        self.k = nn.Linear(shape.hidden, shape.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(shape.hidden, shape.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(shape.heads * self.head_dim, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (proj(x).view(b, s, -1, self.head_dim) for proj in (self.q, self.k, self.v))
        q, k = rotate(q), rotate(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = (t.repeat_interleave(self.groups, dim=1) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.gate = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.up = nn.Linear(shape.hidden, shape.intermediate, bias=False)
        self.down = nn.Linear(shape.intermediate, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(shape.hidden), Attention(shape)
        self.mlp_norm, self.mlp = RMSNorm(shape.hidden), MLP(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(Block(shape) for _ in range(shape.layers))
        self.norm = RMSNorm(shape.hidden)
        self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


TP_PLAN = {"attention.q": "col", "attention.k": "col", "attention.v": "col",
           "attention.o": "row", "mlp.gate": "col", "mlp.up": "col", "mlp.down": "row"}


def build(shape: Shape, variant: Variant, parallel: str, mesh: object, device: str) -> Llama:
    """The model (seed 0 on every rank) in ``variant``'s dtype, parallelized, its blocks
    compiled where the variant compiles."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    with torch.device(device):
        model = Llama(shape).to(variant.dtype)
    styles = {"col": ColwiseParallel, "row": RowwiseParallel}
    for block in model.layers:
        if parallel == "tp":
            parallelize_module(block, mesh, {k: styles[v]() for k, v in TP_PLAN.items()})
        if variant.backends is not None:
            block.compile(mode=MODE)
        if parallel == "fsdp":
            fully_shard(block, mesh=mesh)
    if parallel == "fsdp":
        fully_shard(model, mesh=mesh)
    return model


def batch(shape: Shape, parallel: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their next tokens: the same on every rank under tensor parallelism, a
    shard of the global batch per rank under FSDP."""
    seed = 1 + (dist.get_rank() if parallel == "fsdp" else 0)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(shape.vocab, (shape.batch, shape.seq + 1), generator=generator)
    ids = ids.to(device)
    return ids[:, :-1], ids[:, 1:]


def step(model: Llama, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss = F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.detach()


def gradients(model: Llama) -> list[torch.Tensor]:
    """Every parameter's gradient, whole (a sharded one gathered), in fp32."""
    out = []
    for param in model.parameters():
        grad = param.grad
        grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
        out.append(grad.float())
    return out


class CompiledKernels(logging.Handler):
    """The CuTe kernels this process compiles (the compiler's info log)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("compiled CuteDSL kernel"):
            self.names.append(str(record.args[0]))


@contextlib.contextmanager
def knobs(variant: Variant):
    from torch._inductor import config as inductor_config

    from cutedsl_inductor import config

    if variant.backends is None:
        yield
        return
    with inductor_config.patch(max_autotune_gemm_backends=variant.backends,
                               distributed_max_autotune_gemm=variant.distributed), \
            config.patch(distributed_autotune=variant.distributed):
        yield


def run_variant(variant: Variant, shape: Shape, parallel: str, mesh: object, device: str,
                steps: int) -> tuple[dict, list[torch.Tensor]]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = build(shape, variant, parallel, mesh, device)
    tokens, targets = batch(shape, parallel, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    compiled = CompiledKernels()
    logging.getLogger("cutedsl_inductor.compile.compiler").addHandler(compiled)
    try:
        with knobs(variant):
            start = time.perf_counter()
            loss, codes = run_and_get_code(step, model, tokens, targets)
            synchronize(device)
            first_s = time.perf_counter() - start
            grads = gradients(model)
            losses, times = [float(loss)], []
            for _ in range(steps):
                optimizer.step()
                optimizer.zero_grad()
                start = time.perf_counter()
                losses.append(float(step(model, tokens, targets)))
                synchronize(device)
                times.append(time.perf_counter() - start)
    finally:
        logging.getLogger("cutedsl_inductor.compile.compiler").removeHandler(compiled)
    kernels = sorted({name for code in codes
                      for name in re.findall(r"\b(cutedsl_\w+_[0-9a-f]{12}) = load_kernel", code)})
    row = {"losses": losses, "first_step_s": first_s,
           "step_s": statistics.median(times) if times else math.nan,
           "kernels": kernels, "compiled": compiled.names}
    return row, grads


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_rank(rank: int, world: int, workdir: str, parallel: str, variant_names: list[str],
             shape: Shape, steps: int) -> None:
    """One rank: every variant in turn, errors against the first one's; writes
    ``<workdir>/rank<rank>.json``."""
    from torch.distributed.device_mesh import init_device_mesh

    from cutedsl_inductor.bench.model_workloads import rel_error

    cuda = torch.cuda.is_available()
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    logging.getLogger("cutedsl_inductor.compile.compiler").setLevel(logging.INFO)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{workdir}/store",
                            rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
        report, reference = {}, None
        for name in variant_names:
            row, grads = run_variant(VARIANTS[name], shape, parallel, mesh, device, steps)
            if reference is None:
                reference = (row["losses"], grads)
            row["loss_error"] = rel_error([torch.tensor(row["losses"][0])],
                                          [torch.tensor(reference[0][0])])
            row["grad_error"] = rel_error(grads, reference[1])
            report[name] = row
            del grads
    finally:
        dist.destroy_process_group()
    Path(workdir, f"rank{rank}.json").write_text(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parallel", choices=("fsdp", "tp"), default="fsdp")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--variants", default="fp32,bf16,aten,cutedsl")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="distributed_llama")
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    workdir = str(Path(args.out).resolve())
    Path(workdir, "store").unlink(missing_ok=True)  # the ranks' rendezvous file
    shape = Shape(layers=args.layers, vocab=args.vocab)
    torch.multiprocessing.spawn(run_rank, nprocs=args.gpus, args=(
        args.gpus, workdir, args.parallel, args.variants.split(","), shape, args.steps))
    for rank in range(args.gpus):
        report = json.loads(Path(workdir, f"rank{rank}.json").read_text())
        for name, row in report.items():
            print(f"rank {rank} {args.parallel} {name}: first step {row['first_step_s']:.1f} s, "
                  f"step {row['step_s'] * 1e3:.2f} ms, loss {row['losses'][0]:.4f} "
                  f"(error {row['loss_error']:.2e}), gradients' error {row['grad_error']:.2e}, "
                  f"{len(row['kernels'])} CuteDSL kernels in the code, "
                  f"{len(row['compiled'])} compiled here")


if __name__ == "__main__":
    main()
