"""Sequence (context) parallelism: each rank holds a contiguous slice of every call's video tokens.

From the first block to the last, each rank holds ``1/N`` of the video tokens; attention
exchanges tokens for heads (Ulysses: all-to-all) so every rank attends over the whole sequence
for ``1/N`` of the heads, then exchanges back. Splitting and gathering are diffusers' own
(``ContextParallelConfig``, its hooks and model plans); so is the attention exchange where the
model's processors support it (Wan's, through diffusers' attention dispatcher). sixbit adds:

- a plan and an attention exchange for CogVideoX, which diffusers does not split: its attention
  runs over ``[text, video]``; the text tokens stay whole on every rank (226 of them against
  thousands of video tokens), each rank takes its heads' share of them, and the video tokens go
  through the all-to-all (``torch.distributed``'s functional collective), so the sequence every
  head attends over is ``[text, video]`` in the single process's order;
- the CPU: diffusers' ``enable_parallelism`` assumes an accelerator, so the same config is set
  up here on a CPU device mesh (gloo);
- runtime statistics over every rank's tokens (:mod:`sixbit.nn.token_stats`), so the delta cache,
  DMPQ and PDR decide as the single process does.

On this CPU both shipped models reproduce the single process's videos bit for bit, quantized
ones included (the exchange keeps every head's token order; a different order would round
differently, and quantized models amplify that: see :mod:`sixbit.parallel.tensor`). GEMMs over
fewer tokens may round differently in bf16 (one call of a bf16 CogVideoX-2B-width model: 65 dB).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from diffusers.hooks import ModelHook
from diffusers.hooks.context_parallel import (
    apply_context_parallel,
    remove_context_parallel,
)
from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
from torch import nn
from torch.overrides import TorchFunctionMode

from ..nn import token_stats as distributed
from ..methods.registry import unable
from ..models import iter_blocks, registered, spec_for
from ..runtime import hooks
from ..runtime.blocks import HOOK_NAME as BLOCK_HOOK

ROUTE_HOOK = "sixbit_joint_attention"
GUARD_HOOK = "sixbit_sequence_guard"


def _joint(model: nn.Module) -> bool:
    """Whether ``model`` runs on sixbit's plan (its model spec's ``context_parallel``): a class whose
    diffusers code ships none, and whose attention processors call F.scaled_dot_product_attention
    on [text, video] with the text whole on every rank."""
    return not getattr(model, "_cp_plan", None) and spec_for(model).context_parallel is not None


def plan_for(model: nn.Module) -> dict:
    """diffusers' context-parallel plan of ``model`` (its own, or sixbit's for a class without one)."""
    plan = getattr(model, "_cp_plan", None)
    if plan:
        return plan
    if not _joint(model):
        known = sorted(c for spec in registered().values() if spec.context_parallel is not None for c in spec.classes)
        raise ValueError(f"{type(model).__name__} has no context-parallel plan (diffusers' _cp_plan), and sixbit has "
                         f"none for it (it has: {known}): use mode='tensor'")
    return spec_for(model).context_parallel(model)


def _to_heads(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """``(B, H, L, D)``, this rank's tokens of every head → ``(B, H/N, N·L, D)``, every rank's
    tokens (in rank order) of this rank's heads."""
    b, h, n, d = x.shape
    x = x.reshape(b, world, h // world, n, d).transpose(0, 1).contiguous()
    x = funcol.wait_tensor(funcol.all_to_all_single(x, None, None, group))
    return x.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * n, d)


def _to_tokens(x: torch.Tensor, group, world: int) -> torch.Tensor:
    """The inverse of :func:`_to_heads`."""
    b, h, n, d = x.shape
    x = x.reshape(b, h, world, n // world, d).permute(2, 0, 1, 3, 4).contiguous()
    x = funcol.wait_tensor(funcol.all_to_all_single(x, None, None, group))
    return x.transpose(0, 1).reshape(b, world * h, n // world, d)


def joint_attention(q, k, v, text: int, scale, group) -> torch.Tensor:
    """Attention over ``[text, video]`` (``(B, H, T + L, D)`` each; the ``T`` text tokens whole on
    every rank, ``L`` video tokens this rank's slice), as the single process computes it."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    h = q.shape[1] // world

    def gather(x):
        return torch.cat([x[:, rank * h:(rank + 1) * h, :text], _to_heads(x[:, :, text:], group, world)], dim=2)

    out = F.scaled_dot_product_attention(gather(q), gather(k), gather(v), scale=scale)
    text_out = funcol.wait_tensor(funcol.all_gather_single(out[:, :, :text].contiguous(), 1, group))
    return torch.cat([text_out, _to_tokens(out[:, :, text:], group, world)], dim=2)


class _JointSDPA(TorchFunctionMode):
    def __init__(self, text: int, group):
        super().__init__()
        self.text, self.group = text, group

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v, *rest = args
        if rest or kwargs.get("attn_mask") is not None or kwargs.get("is_causal") or kwargs.get("dropout_p"):
            raise ValueError("sequence parallelism runs unmasked, non-causal attention only; this model's attention "
                             "has a mask, dropout or causal flag: use mode='tensor'")
        return joint_attention(q, k, v, self.text, kwargs.get("scale"), self.group)


class _JointHook(ModelHook):
    """Inside an attention module: its ``F.scaled_dot_product_attention`` call → :func:`joint_attention`."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def new_forward(self, module, *args, **kwargs):
        text = kwargs.get("encoder_hidden_states")
        with _JointSDPA(0 if text is None else text.shape[1], self.group):
            return self.fn_ref.original_forward(*args, **kwargs)


@dataclasses.dataclass
class SequenceShards:
    """What :func:`enable` installed: the plan, the processors it configured and the modules it routes."""

    plan: dict
    configured: list[nn.Module]
    routed: list[nn.Module]


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if getattr(m, "processor", None) is not None and hasattr(m, "to_q")]


def check(model: nn.Module, world: int) -> None:
    """Refuse a model sequence parallelism cannot run across ``world`` ranks (nothing changes)."""
    plan_for(model)
    if not _joint(model):
        plain = sorted({type(m.processor).__name__ for m in _attention_modules(model)
                        if not hasattr(m.processor, "_parallel_config")})
        if plain:
            raise ValueError(f"the attention processors {plain} do not support diffusers' context parallelism: "
                             "use mode='tensor'")
    heads = {m.heads for m in _attention_modules(model)}
    bad = sorted(h for h in heads if h % world)
    if bad:
        raise ValueError(f"Ulysses attention splits the heads across ranks: {bad[0]} heads do not divide across "
                         f"{world} ranks; run with a number of processes that divides {bad[0]}, or mode='tensor'")
    for name, why in unable("sequence_parallel", model):
        raise ValueError(f"{why}: convert without the runtime method {name!r}, or use mode='tensor'")


def enable(model: nn.Module, group) -> SequenceShards:
    """Split ``model``'s tokens across ``group`` (in place; see the module doc)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if world != dist.get_world_size():
        raise ValueError("sequence parallelism runs on the default process group (every rank) only")
    check(model, world)
    cp = ContextParallelConfig(ulysses_degree=world)
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    mesh = dist.device_mesh.init_device_mesh(device, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(rank, world, torch.device(device), mesh=mesh)
    configured, routed = [], []
    plan = plan_for(model)
    joint = _joint(model)
    for m in _attention_modules(model):
        if joint:
            hooks.register(m, _JointHook(group), ROUTE_HOOK)
            routed.append(m)
        else:
            m.processor._parallel_config = config
            configured.append(m)
    apply_context_parallel(model, cp, plan)  # after the runtime methods' block hooks: it wraps them
    distributed.set_token_group(group)
    hooks.register(model, _Guard(world), GUARD_HOOK)  # outermost
    return SequenceShards(plan, configured, routed)


class _Guard(ModelHook):
    """Around the whole call: refuse methods installed after the split; name the fix when the
    tokens do not split evenly (diffusers' sharder only asserts)."""

    def __init__(self, world: int):
        super().__init__()
        self.world = world

    def new_forward(self, module, *args, **kwargs):
        check_order(module)
        try:
            return self.fn_ref.original_forward(*args, **kwargs)
        except AssertionError as e:
            if "divisible by mesh size" not in str(e):
                raise
            raise ValueError(f"this call's video tokens do not split evenly across {self.world} ranks: choose frames, "
                             f"height and width whose latent patches divide by {self.world}, or use mode='tensor'") from None


def check_order(model: nn.Module) -> None:
    """Refuse to run when a runtime method was installed after the split (it would see whole
    inputs and split outputs): install methods first, then wrap."""
    for _, _, block, _ in iter_blocks(model):
        order = hooks.names(block)
        if BLOCK_HOOK in order and any(n.startswith("cp_") for n in order) and \
                order.index(BLOCK_HOOK) > max(i for i, n in enumerate(order) if n.startswith("cp_")):
            raise RuntimeError("a runtime method (delta cache, DMPQ) was installed after the model was made "
                               "sequence-parallel: install it first (convert_model, enable_delta_cache), then wrap")


def disable(model: nn.Module, shards: SequenceShards) -> None:
    """Undo :func:`enable`: whole sequences on every rank again."""
    remove_context_parallel(model, shards.plan)
    for m in shards.configured:
        m.processor._parallel_config = None
    for m in shards.routed:
        hooks.remove(m, ROUTE_HOOK)
    hooks.remove(model, GUARD_HOOK)
    distributed.set_token_group(None)
