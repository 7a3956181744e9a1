"""Quantized attention per block and step (SageAttention's method; seed 000's low-bit attention).

:func:`apply_attention_quant` hooks every attention module (one with a diffusers processor)
inside the model's blocks. While a selected block runs at a selected step, the processor's
``F.scaled_dot_product_attention`` calls (directly, or through diffusers' attention dispatcher's
native backend) go to :func:`sixbit.kernels.attention.int8_attention`: INT8 Q·Kᵀ after smoothing
K by its token mean, FP16 P·V. Calls it cannot take (a mask, dropout, causal, grouped heads) run
unchanged and are counted. Real on CUDA (the ``sageattention`` package where installed, else
sixbit's Triton kernel on sm_80+); **emulated** elsewhere — the method's numerics, not INT8 speed
(see :func:`sixbit.kernels.attention.int8_attention_path`).

Config → state → hook → ``apply_attention_quant`` / ``remove_attention_quant``. As part of a
conversion, ``ConvertConfig(..., attention=AttentionQuantConfig(...))`` installs it through
:func:`sixbit.convert_model`, and checkpoints carry it (:mod:`sixbit.convert`'s extension).

Example:
    >>> state = apply_attention_quant(pipe.transformer, AttentionQuantConfig(steps=(2, None)))  # doctest: +SKIP
    >>> pipe("a red circle moving right"); state.quantized_calls > 0                           # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging

import torch.nn.functional as F
from diffusers.hooks import ModelHook
from torch import nn
from torch.overrides import TorchFunctionMode

from ...config.attention import AttentionQuantConfig
from ...kernels.attention import int8_attention, int8_attention_path
from ...models import iter_blocks, spec_for, transformer_of
from ...runtime import hooks
from ...runtime.context import track_steps
from ...runtime.wrapped import changes_model
from ..registry import attention_kernel_clash

HOOK_NAME = "sixbit_attention_quant"

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class AttentionQuantState:
    """Counts of the attention calls since the last :meth:`reset`."""

    config: AttentionQuantConfig
    path: str = ""
    quantized_calls: int = 0
    full_precision_calls: int = 0  # outside the selected blocks / steps
    unsupported_calls: int = 0  # a mask, dropout, causal or grouped heads: run unchanged

    def reset(self) -> None:
        self.quantized_calls = self.full_precision_calls = self.unsupported_calls = 0


class _StepWindow:
    """Warns, once per step count, when ``config.steps`` selects no step of a run: the step
    count is known at the first call of a pipeline run (its cache context says), or, in a plain
    loop, when the run ends (the next one starts)."""

    def __init__(self, config: AttentionQuantConfig, tracker):
        self.config, self.tracker = config, tracker
        self.steps_seen = 0  # steps of the current run so far
        self.checked = False  # this run's step count was known and checked
        self.warned: set[int] = set()
        tracker.on_new_generation(self.end_of_run)

    def observe(self, info) -> None:
        if self.checked or self.config.steps is None:
            return
        self.steps_seen = max(self.steps_seen, info.step + 1)
        if info.num_steps is not None:
            self.checked = True
            self._check(info.num_steps)

    def end_of_run(self) -> None:
        if not self.checked and self.steps_seen:
            self._check(self.steps_seen)
        self.steps_seen, self.checked = 0, False

    def _check(self, count: int) -> None:
        if count in self.warned or any(self.config.selects_step(step) for step in range(count)):
            return
        self.warned.add(count)
        logger.warning("quantized attention's steps=%s selects no step of this %d-step run (%s): its attention "
                       "runs in full precision; choose steps that start below %d, or steps=None for every step",
                       self.config.steps, count, "step 0" if count == 1 else f"steps 0–{count - 1}", count)

    def detach(self) -> None:
        self.tracker.remove_listener(self.end_of_run)


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class _QuantSDPA(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to the INT8 method while active."""

    def __init__(self, state: AttentionQuantState):
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            call = {**dict(zip(_SDPA_ARGS, args)), **kwargs}
            q, k, v = call["query"], call["key"], call["value"]
            if (call.get("attn_mask") is None and not call.get("dropout_p") and not call.get("is_causal")
                    and not call.get("enable_gqa") and q.shape[:-2] == k.shape[:-2]):
                self.state.quantized_calls += 1
                return int8_attention(q, k, v, call.get("scale"), p_format=self.state.config.p_format)
            self.state.unsupported_calls += 1
        return func(*args, **kwargs)


class _AttentionHook(ModelHook):
    """Runs an attention module with quantized attention when its block and the step are selected."""

    def __init__(self, block: int, state: AttentionQuantState, tracker, window: _StepWindow):
        super().__init__()
        self.block, self.state, self.tracker, self.window = block, state, tracker, window

    def new_forward(self, module, *args, **kwargs):
        info = self.tracker.info
        if info is not None:
            self.window.observe(info)
        if self.state.config.selects(self.block, 0 if info is None else info.step):
            with _QuantSDPA(self.state):
                return self.fn_ref.original_forward(*args, **kwargs)
        self.state.full_precision_calls += 1
        return self.fn_ref.original_forward(*args, **kwargs)


def attention_modules(model: nn.Module) -> list[tuple[int, nn.Module]]:
    """(block index, module) of every attention module (one with a diffusers processor) in
    ``model``'s blocks; a ``ValueError`` when there is none (nothing to quantize)."""
    modules = [(index, module) for index, _, block, _ in iter_blocks(model, spec_for(model))
               for module in block.modules() if callable(getattr(module, "processor", None))]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention modules with a processor inside its blocks: "
                         "its attention cannot be quantized (leave attention=None)")
    return modules


def check_attention(model: nn.Module, config: AttentionQuantConfig, convert_config=None) -> list[tuple[int, nn.Module]]:
    """``model``'s attention modules (:func:`attention_modules`), after refusing a block range that
    selects none of its blocks, or another method replacing the attention kernel (installed, or
    selected by ``convert_config``); changes nothing."""
    modules = attention_modules(model)
    other = attention_kernel_clash("attention", model, convert_config)
    if other is not None:
        raise ValueError(f"quantized attention and the method {other!r} both replace the attention kernel and do not "
                         f"run together yet: keep one (for sparse attention: sixbit.remove_sparse_attention(model), or "
                         f"leave its config out of ConvertConfig.methods)")
    count = len(list(iter_blocks(model)))
    if not any(config.selects_block(index) for index in range(count)):
        raise ValueError(f"blocks={config.blocks} selects none of {type(model).__name__}'s {count} blocks "
                         f"(0–{count - 1}): choose a range within them, or blocks=None for all")
    return modules


@changes_model("apply_attention_quant")
def apply_attention_quant(model: nn.Module, config: AttentionQuantConfig | None = None) -> AttentionQuantState:
    """Quantize the attention of ``model``'s blocks (or a pipeline's transformer's) where
    ``config`` selects (default: everywhere). A block range that selects no block of the model
    is refused; a step range that selects no step of a run is warned about (logging, once per
    step count) when the run's step count is known: at its first call in a pipeline, at its end
    in a plain loop."""
    model = transformer_of(model)
    config = config or AttentionQuantConfig()
    if not isinstance(config, AttentionQuantConfig):
        raise ValueError(f"config must be an AttentionQuantConfig, got {type(config).__name__}")
    modules = check_attention(model, config)
    remove_attention_quant(model)
    state = AttentionQuantState(config, int8_attention_path(next(model.parameters()).device, config.p_format))
    tracker = track_steps(model)
    window = _StepWindow(config, tracker)
    for index, module in modules:
        hooks.register(module, _AttentionHook(index, state, tracker, window), HOOK_NAME)
    return state


def _hooks(model: nn.Module):
    for module in model.modules():
        hook = hooks.get(module, HOOK_NAME)
        if hook is not None:
            yield module, hook


@changes_model("remove_attention_quant")
def remove_attention_quant(model: nn.Module) -> None:
    """Run attention in full precision again (a no-op where it was not quantized)."""
    for module, hook in list(_hooks(transformer_of(model))):
        hook.window.detach()
        hooks.remove(module, HOOK_NAME)


def attention_quant_of(model: nn.Module) -> AttentionQuantState | None:
    """The state of the quantized attention installed on ``model``, if any."""
    return next((hook.state for _, hook in _hooks(model)), None)
