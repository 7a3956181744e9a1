"""Which linears a conversion quantizes (:func:`plan_layers`) and how one is built
(:func:`quantized_linear`): the format, the Hadamard block or smoothing, the rounding
(:mod:`sixbit.rounding`: scale search, GPTQ) and the 16-bit low-rank branch.

"Linears" are ``nn.Linear`` layers, pointwise (1×1) convolutions, which are linear layers
applied to each position's channels (:mod:`sixbit.nn.pointwise_conv`), and convolutions with a
wider kernel (one group, stride 1, zero padding), linear layers on their unfolded input
(:mod:`sixbit.nn.unfolded_conv`): all are planned and built alike, a conv into a
:class:`~sixbit.nn.QuantPointwiseConv` or a :class:`~sixbit.nn.QuantUnfoldedConv` whose
``in_features`` is its input channels × kernel taps."""

from __future__ import annotations

import collections
import dataclasses
import difflib
import logging
import re

import torch
from torch import nn

from .. import formats
from ..config.validate import report, show
from ..calibration import hessians
from ..config import QuantConfig
from ..models import Role, block_index_of, iter_blocks, spec_for
from ..nn import QuantLinear, execution
from ..nn.pointwise_conv import conv_arguments, features, is_quantizable, kind_of, quantized_layer_class, weight_2d
from ..rounding import BRANCH_DTYPE, quantize_weight, supports
from ..transforms import hadamard, smoothquant
from ..transforms.hadamard import BLOCK_SIZES

logger = logging.getLogger(__name__)


def format_fits(fmt_name: str, in_features: int) -> bool:
    """Whether ``fmt_name``'s scale block divides ``in_features`` (a layer it does not fit stays
    in full precision)."""
    block = formats.get(fmt_name).block_size
    return block is None or in_features % block == 0


def _hadamard_block(limit: int | None, in_features: int) -> int | None:
    """The largest supported Hadamard block ≤ ``limit`` that divides ``in_features``."""
    if limit is None:
        return None
    fits = [b for b in BLOCK_SIZES if b <= limit and in_features % b == 0]
    return max(fits) if fits else None


def _check_layer_names(model: nn.Module, config: QuantConfig) -> None:
    """Refuse ``layer_formats`` names that are not linears of ``model`` or that ``include`` /
    ``exclude`` leave out: a per-layer choice that silently did nothing would be a wrong model."""
    if not config.layer_formats:
        return
    linears = {name for name, mod in model.named_modules() if is_quantizable(mod)}
    problems = []
    for name in config.layer_formats:
        if name not in linears:
            close = difflib.get_close_matches(name, sorted(linears), n=1)
            problems.append(f"{show(name)} is not a linear layer of the model"
                            + (f" (did you mean {close[0]!r}?)" if close else " (sixbit.summary(model) lists them)"))
        elif (config.include and not any(re.fullmatch(p, name) for p in config.include)) or any(
                re.fullmatch(p, name) for p in config.exclude):
            problems.append(f"layer_formats names {name!r}, which include/exclude leave out: drop one of the two")
    if problems:
        raise ValueError(report(f"QuantConfig.layer_formats does not fit {type(model).__name__}", problems))


def selected_layers(model: nn.Module, include=(), exclude=(), boundary_blocks: int = 0, quantized: bool = False):
    """``(name, module, role, block index or None, boundary?)`` of every linear of ``model`` (an
    ``nn.Linear``, a pointwise or an unfoldable conv; and its ``QuantLinear`` already built where
    ``quantized``) that the ``include`` / ``exclude`` patterns (``re.fullmatch``) keep: the one
    layer selection of every conversion (:func:`plan_layers`, static W8A8's plan). ``boundary``:
    within ``boundary_blocks`` of either end of the model's blocks."""
    spec = spec_for(model)
    blocks = {name: idx for idx, name, _, _ in iter_blocks(model, spec)}
    n_blocks = max(blocks.values()) + 1
    for name, mod in model.named_modules():
        if not (is_quantizable(mod) or (quantized and isinstance(mod, QuantLinear))):
            continue
        if include and not any(re.fullmatch(p, name) for p in include):
            continue
        if any(re.fullmatch(p, name) for p in exclude):
            continue
        idx = block_index_of(name, blocks)
        boundary = idx is not None and boundary_blocks > 0 and (idx < boundary_blocks or idx >= n_blocks - boundary_blocks)
        yield name, mod, spec.role_of(name), idx, boundary


def plan_layers(model: nn.Module, config: QuantConfig) -> dict[str, tuple[str, int | None, str]]:
    """``{layer name: (format, hadamard block, role)}`` for every linear (``nn.Linear`` or pointwise
    conv) to quantize."""
    _check_layer_names(model, config)
    plan, misfits = _plan(model, config)
    for name, in_features, fmt in misfits:
        logger.warning("%s: in_features=%d is not a multiple of %s's block %d; kept in full precision",
                       name, in_features, fmt, formats.get(fmt).block_size)
    return plan


def _plan(model: nn.Module, config: QuantConfig):
    """``(plan, misfits)``: :func:`plan_layers`' plan, and ``(name, in_features, format)`` of the
    layers left out because the format's block does not divide their ``in_features``."""
    plan, misfits = {}, []
    for name, mod, role, _, boundary in selected_layers(model, config.include, config.exclude, config.boundary_blocks):
        fmt = config.format_for(role)
        if name in config.layer_formats:
            fmt = config.layer_formats[name]
        elif fmt is not None and boundary:
            fmt = config.boundary_format
        if fmt is None:
            continue
        in_features = features(mod)[0]
        if not format_fits(fmt, in_features):
            misfits.append((name, in_features, fmt))
            continue
        plan[name] = (fmt, _hadamard_block(config.hadamard_block, in_features), role.value)
    return plan, misfits


def check_plan(model: nn.Module, config: QuantConfig) -> None:
    """Refuse ``config`` where it would quantize no linear of ``model``, naming why (no layer
    has a role it quantizes, ``include``/``exclude`` leave none, no format fits): a conversion
    that changes nothing must not report success. Where only ``boundary_blocks`` keeps every
    layer in full precision (a model with few blocks), which the config asks for, it warns."""
    _check_layer_names(model, config)
    if _plan(model, config)[0]:
        return
    name = type(model).__name__
    kept = list(selected_layers(model, config.include, config.exclude))
    if not kept:
        raise ValueError(
            f"{name} has no linear layer sixbit quantizes (nn.Linear, or a convolution it runs as one)"
            if not (config.include or config.exclude) else
            f"QuantConfig include={config.include!r} and exclude={config.exclude!r} leave none of {name}'s linear "
            "layers to quantize: fix the patterns (re.fullmatch on the names sixbit.summary(model) lists), "
            "or give weights=None to keep every weight in full precision")
    unbounded, misfits = _plan(model, dataclasses.replace(config, boundary_blocks=0))
    if unbounded:
        blocks = len(list(iter_blocks(model)))
        logger.warning(
            "%s has %d blocks, and boundary_blocks=%d keeps the first and last %d in full precision "
            "(boundary_format=None): they hold every layer this config quantizes, so no weight is quantized; "
            "set boundary_blocks=0 (QuantConfig) to quantize them", name, blocks, config.boundary_blocks,
            config.boundary_blocks)
        return
    if misfits:
        layer, in_features, fmt = misfits[0]
        raise ValueError(f"no layer of {name} fits the formats this config gives them: e.g. {layer!r} has "
                         f"in_features={in_features}, not a multiple of {fmt}'s block {formats.get(fmt).block_size}; "
                         "choose a format with a smaller block (`sixbit formats` lists them)")
    roles = collections.Counter(role.value for _, _, role, _, _ in kept)
    wanted = [role.value for role in Role if config.format_for(role) is not None]
    example = next(layer for layer, _, role, _, _ in kept if role.value == roles.most_common(1)[0][0])
    raise ValueError(
        f"none of {name}'s {len(kept)} linear layers has a role this config quantizes ({wanted}): sixbit reads "
        f"their roles as {dict(roles)} ('other': a name it does not recognize, e.g. {example!r}); register the "
        "model's roles, sixbit.models.register_model(ModelSpec(..., roles=((Role.ATTENTION, r'...'), ...))), "
        "or quantize them by role: QuantConfig(role_formats={'other': 'int8'})")


# Formats of at most this many bits per element get the low-rank branch (8-bit ones need none).
_BRANCH_MAX_BITS = 4


def branch_rank(linear: nn.Module, fmt: str, config: QuantConfig, role: str) -> int:
    """Rank of the low-rank branch :func:`quantized_linear` gives ``linear`` in ``fmt`` (0: none)."""
    # The branch goes on the 4-bit compute layers. Measured on the shipped CogVideoX (W4A16, GPTQ +
    # MSE scales, 4 held-out pairs): a branch on the weight-only modulation layers too cost 4.4 dB.
    if formats.get(fmt).element_bits > _BRANCH_MAX_BITS or role in config.weight_only_roles:
        return 0
    return config.lowrank_rank_for(*features(linear))


def stored_bits(linear: nn.Module, fmt: str, config: QuantConfig, role: str) -> float:
    """Bits per weight :func:`quantized_linear` stores for ``linear`` in ``fmt`` (codes, scales and
    the low-rank branch), known from the shapes alone, before anything is built: a format's packed
    size grows by the same bytes per row, so one and two rows of zeros give it for every row count."""
    k, n = features(linear)
    one, two = (formats.get(fmt).quantize(torch.zeros(rows, k)).nbytes for rows in (1, 2))
    branch = branch_rank(linear, fmt, config, role) * (k + n) * BRANCH_DTYPE.itemsize
    return 8 * (one + (n - 1) * (two - one) + branch) / (k * n)


def check_source_weight(linear: nn.Module, name: str | None = None, source: str | None = None) -> None:
    """Refuse a layer whose full-precision weight holds NaN or Inf, naming the tensor (``name``:
    the layer's path in the model) and ``source``, the file it was read from: no rounding can
    make sense of it, and the fix is a good copy of the weights, not a look at the conversion."""
    w = linear.weight.detach()
    if not w.numel() or not w.is_floating_point():
        return
    low, high = torch.aminmax(w if w.element_size() > 1 else w.float())  # a NaN or Inf shows in one of them
    if bool(torch.isfinite(low) & torch.isfinite(high)):
        return
    bad = int((~torch.isfinite(w.float())).sum())
    what = f"{name}.weight" if name else "a linear layer's weight"
    if source:
        raise ValueError(f"{what} in {source} holds {bad} NaN/Inf value(s) out of {w.numel()}: the file is damaged "
                         "(the source weights, before any conversion); download it again, or compare it with its "
                         "published checksum")
    raise ValueError(f"{what} holds {bad} NaN/Inf value(s) out of {w.numel()}: the model's own weights are damaged, "
                     "before any conversion; reload the model from its checkpoint (and download that again if it "
                     "holds them too)")


def quantized_linear(linear: nn.Module, fmt: str, hadamard_block: int | None, config: QuantConfig, role: str,
                     stats: hessians.InputStats | None = None, *, name: str | None = None,
                     source: str | None = None) -> QuantLinear:
    """The :class:`QuantLinear` for ``linear`` (an ``nn.Linear``; a pointwise conv: then a
    :class:`~sixbit.nn.QuantPointwiseConv`; an unfoldable conv: a
    :class:`~sixbit.nn.QuantUnfoldedConv`) as ``config`` says (``stats``: its inputs, features
    last as :func:`~sixbit.nn.pointwise_conv.features_last` gives them, or ``None``). A weight
    holding NaN or Inf is refused naming ``name`` (the layer's path) and ``source`` (the file the
    weight was read from), :func:`check_source_weight`."""
    check_source_weight(linear, name, source)
    weight_only = role in config.weight_only_roles
    rank = branch_rank(linear, fmt, config, role)
    divisor = None
    if rank and config.smooth_alpha is not None and stats is not None:
        divisor = smoothquant.smoothing_factors(stats.amax, smoothquant.weight_channel_amax(weight_2d(linear)),
                                                config.smooth_alpha)
        hadamard_block = None  # smoothing replaces the rotation
    w = QuantLinear.stored_weight(linear, hadamard_block, divisor)
    hessian = None
    if stats is not None:
        hessian = stats.hessian
        if hadamard_block is not None:  # the stored space: (x·R)ᵀ(x·R) = Rᵀ H R
            hessian = hadamard.rotate(hadamard.rotate(hessian, hadamard_block).T.contiguous(), hadamard_block)
        if divisor is not None:  # (x / s)ᵀ(x / s)
            hessian = hessian / torch.outer(divisor, divisor)
    searchable = supports(fmt)
    use_gptq = config.gptq and searchable and hessian is not None
    q, branch = quantize_weight(
        w, fmt, config.scale_rule if searchable else "absmax", hessian, use_gptq,
        config.gptq_damp, rank, config.lowrank_iterations,
    )
    layer = quantized_layer_class(kind_of(linear))(
        q, fmt, linear.bias, hadamard_block, config.act_mode, source_dtype=linear.weight.dtype, input_divisor=divisor,
        lowrank=branch, weight_only=weight_only, **conv_arguments(linear))
    for note in execution.cuda_notes(layer):  # the shape torch's CUDA GEMMs take, checked wherever this converts
        logger.info("%s (in %d → out %d): on CUDA, %s", name or "a linear", layer.in_features, layer.out_features, note)
    return layer
