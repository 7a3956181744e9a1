"""Tensor parallelism: every rank keeps a slice of each linear's output rows.

- **Attention**: the q, k and v projections (and added ones) are cut by heads, so each rank runs
  attention on its own heads (``attn.heads`` becomes the local count). A norm taken across all
  heads (Wan's RMSNorm on q and k) gathers them, runs whole, and keeps this rank's slice. The
  output projection gathers the heads, computes its slice of rows and gathers that.
- **Feed-forward** (diffusers ``FeedForward`` with an element-wise activation): the first
  projection is cut by hidden units, the second gathers them and computes its slice of rows.
- **Every other linear** (modulation, embeddings, the final projection) computes its slice of
  rows and gathers it; one whose rows do not divide by the world size stays whole on every rank.

Why output rows only (column parallelism), never the input dimension (Megatron's row-parallel
second layer): a row slice sees the whole input, so every format, Hadamard block, activation
scale (per token, per tensor, static) and runtime decision is the single-process one, and the
packed formats need no cut inside their blocks (they run along the input). No sum is split
across ranks: the shipped (fp32) models' videos are bit for bit the single process's at the
workers' thread count, quantized and cached ones included (measured on AMX and AVX512-VNNI CPUs;
at another thread count a BLAS may round differently: README, parallel; bf16 GEMM kernels may
round a narrower output differently: one call of a bf16 CogVideoX-2B-width model came out at
57–64 dB). That matters: a
quantized model amplifies a 1e-7 relative difference in one block's output into a 40–46 dB video
difference (INT8 roundings flip, and the sampler compounds them), so a split sum of squares or a
row-parallel partial sum would cost more than all of the quantization's own error budget. The
price is two all-gathers per projection pair where row parallelism needs one all-reduce.
Between layers every rank holds the whole activations, so norms, modulation, the delta cache
and DMPQ compute the same values, and decide the same, on every rank.

Communication is ``torch.distributed``'s functional all-gather on the given process group (gloo
on CPUs, NCCL on GPUs): no collective of sixbit's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from ..lora import linear_up_factors, set_linear_up
from ..nn import QuantLinear, execution
from ..nn.row_shards import LORA_PREFIX
from .feed_forward import feed_forwards, is_linear, last_linear


def _rows(n: int, rank: int, world: int) -> tuple[int, int]:
    step = n // world
    return rank * step, (rank + 1) * step


def _gather_last(x: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``x`` concatenated along the last dimension, in rank order."""
    return funcol.wait_tensor(funcol.all_gather_single(x.contiguous(), x.dim() - 1, group))


def _gather_input(group):
    """A forward pre-hook: the module's first input gathered from every rank (last dimension)."""
    return lambda _, args: (_gather_last(args[0], group), *args[1:])


def _width(norm: nn.Module) -> int | None:
    """The size a norm module normalizes over (its last dimension), or ``None``."""
    shape = getattr(norm, "normalized_shape", None) or getattr(norm, "dim", None)
    if shape is None:
        return None
    return int(shape) if isinstance(shape, int) else int(tuple(shape)[-1])


def row_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of a cut linear that hold one slice per output row: a LoRA loaded before the
    split (its up factor, ``lora_<name>_up``) is cut with them."""
    if isinstance(module, QuantLinear):
        return module.row_tensors()
    out = {name: t for name, t in (("weight", module.weight), ("bias", getattr(module, "bias", None))) if t is not None}
    out.update({f"{LORA_PREFIX}{name}_up": up for name, up in linear_up_factors(module).items()})
    return out


def set_rows(module: nn.Module, tensors: dict[str, torch.Tensor], rows: int) -> None:
    """Replace a cut linear's per-row tensors by ones for ``rows`` rows."""
    if isinstance(module, QuantLinear):
        module.set_rows(tensors, rows)
        return
    for name, t in tensors.items():
        if name.startswith(LORA_PREFIX):
            set_linear_up(module, name.removeprefix(LORA_PREFIX).removesuffix("_up"), t)
        else:
            setattr(module, name, nn.Parameter(t, requires_grad=getattr(module, name).requires_grad))
    module.out_features = rows


def _narrow(module: nn.Module, start: int, stop: int) -> None:
    if isinstance(module, QuantLinear):
        module.narrow_rows(start, stop)
    else:
        set_rows(module, {n: t.detach()[start:stop].clone() for n, t in row_tensors(module).items()}, stop - start)


@dataclasses.dataclass
class TensorShards:
    """What :func:`shard` did to a model.

    Attributes:
        cut: module name → its full number of rows (every rank holds ``rows / world`` of them).
        heads: attention module name → its full number of heads.
        whole: linears left whole on every rank (rows not divisible by the world size).
    """

    group: object
    rank: int
    world: int
    cut: dict[str, int] = dataclasses.field(default_factory=dict)
    heads: dict[str, int] = dataclasses.field(default_factory=dict)
    whole: list[str] = dataclasses.field(default_factory=list)


def _attention_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules()
            if all(isinstance(getattr(m, a, None), nn.Module) for a in ("to_q", "to_k", "to_v"))
            and isinstance(getattr(m, "heads", None), int)}


def check(model: nn.Module, world: int) -> None:
    """Refuse a model tensor parallelism cannot split across ``world`` ranks (nothing changes)."""
    for name, attn in _attention_modules(model).items():
        if attn.heads % world:
            raise ValueError(f"{name} has {attn.heads} attention heads, which do not divide across {world} ranks: "
                             f"run with a number of processes that divides {attn.heads}, or mode='sequence'")
        for proj in ("to_q", "to_k", "to_v"):
            layer = getattr(attn, proj)
            if not is_linear(layer):
                raise ValueError(f"{name}.{proj} is a {type(layer).__name__}, not a linear: cannot cut it by heads")
            if layer.out_features != attn.to_q.out_features:
                raise ValueError(f"{name} has fewer key/value heads than query heads (grouped-query attention), "
                                 "which tensor parallelism does not cut: use mode='sequence'")
    for name, m in model.named_modules():
        if not isinstance(m, QuantLinear):
            continue
        if execution.is_static(m):
            raise ValueError(f"{name} has static activation scales (static W8A8), which tensor parallelism does not "
                             "split: use mode='sequence' or another preset")
        try:
            m.quantized_weight().rows(0, 1)
        except NotImplementedError as e:
            raise ValueError(f"{name}'s {m.weight_format} weight cannot be cut by rows ({e}): "
                             "use mode='sequence'") from None


def shard(model: nn.Module, group) -> TensorShards:
    """Cut ``model`` in place for this rank of ``group``; returns what was cut (see the module doc)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    check(model, world)
    shards = TensorShards(group, rank, world)
    modules = dict(model.named_modules())
    local = set()  # linears whose output stays cut (the next op takes this rank's slice)
    gathered_in = set()  # linears whose input is a cut one's output

    def cut(name: str, rows: int) -> None:
        start, stop = _rows(rows, rank, world)
        _narrow(modules[name], start, stop)
        shards.cut[name] = rows

    for name, attn in _attention_modules(model).items():
        heads = attn.heads
        for proj in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
            if is_linear(getattr(attn, proj, None)):
                cut(f"{name}.{proj}", getattr(attn, proj).out_features)
                local.add(f"{name}.{proj}")
        inner = shards.cut[f"{name}.to_q"]
        for norm in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            n = getattr(attn, norm, None)
            if n is not None and _width(n) == inner:  # across all heads: run it on all of them, keep ours
                start, stop = _rows(inner, rank, world)
                n.register_forward_pre_hook(_gather_input(group))
                n.register_forward_hook(lambda _, __, y, a=start, b=stop: y[..., a:b])
        for out in ("to_out.0", "to_add_out"):
            if is_linear(modules.get(f"{name}.{out}")):
                gathered_in.add(f"{name}.{out}")
        attn.heads = heads // world
        for attr in ("inner_dim", "inner_kv_dim", "kv_inner_dim"):
            if isinstance(getattr(attn, attr, None), int):
                setattr(attn, attr, getattr(attn, attr) // world)
        shards.heads[name] = heads
    for name, m in feed_forwards(model).items():  # proj → element-wise activation → linear: cut by hidden units
        net = m.net
        if net[0].proj.out_features % world == 0:
            first, last = f"{name}.net.0.proj", f"{name}.net.{last_linear(net)}"
            cut(first, net[0].proj.out_features)
            local.add(first)
            gathered_in.add(last)
    for name, m in modules.items():
        if not is_linear(m) or name in local:
            continue
        if name not in gathered_in and m.out_features % world:
            shards.whole.append(name)
            continue
        if name in gathered_in:
            m.register_forward_pre_hook(_gather_input(group))
        if m.out_features % world:  # its input was gathered; it stays whole
            shards.whole.append(name)
            continue
        cut(name, m.out_features)
        m.register_forward_hook(lambda _, __, y: _gather_last(y, group))
    return shards


@contextlib.contextmanager
def whole_on_rank0(model: nn.Module, shards: TensorShards) -> Iterator[None]:
    """Rank 0 holds the whole weights inside (the other ranks send theirs): to write one
    checkpoint. Every rank must enter it; rank 0's cuts are back in place when it exits."""
    modules = dict(model.named_modules())
    root = dist.get_global_rank(shards.group, 0)
    kept = {}
    try:
        for name, rows in shards.cut.items():
            m = modules[name]
            mine, whole = row_tensors(m), {}
            for key, t in mine.items():
                raw = t.detach().contiguous().view(torch.uint8)  # as bytes: gloo sends no FP8
                parts = [torch.empty_like(raw) for _ in range(shards.world)] if shards.rank == 0 else None
                dist.gather(raw, parts, dst=root, group=shards.group)
                if parts is not None:
                    whole[key] = torch.cat(parts).view(t.dtype)
            if shards.rank == 0:
                kept[name] = (mine, m.out_features)
                set_rows(m, whole, rows)
        yield
    finally:
        for name, (mine, count) in kept.items():
            set_rows(modules[name], mine, count)
