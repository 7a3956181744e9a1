"""SmoothQuant channel balancing: move activation outliers into the weight, exactly.

For a linear layer ``y = x·Wᵀ`` and a positive per-input-channel vector ``s``,
``y = (x / s)·(W·diag(s))ᵀ``: dividing activations by ``s`` and multiplying the weight's
columns by ``s`` changes nothing in exact arithmetic, but it flattens the activation's
per-channel ranges (easier to quantize per tensor) at the cost of the weight's. SmoothQuant
(Xiao et al., 2023) picks

    ``s_c = max|x_c|^α / max|W_{:,c}|^(1-α)``

with α ∈ [0, 1] setting how much difficulty moves to the weight (α = 0: none of the
activation range is kept, ``s = 1 / max|W|``; α = 1: activations become flat). The source of
static W8A8 uses α = 0.625 with dynamic activations, 0.4 when ``max|x_c|`` is aggregated over
all steps (ASQ) and 0.2 when it is taken per time range (TSQ).

Everything here is a pure function of tensors: no state, no hooks.
"""

from __future__ import annotations

import torch

from ..formats import integer

#: Smoothing factors are clamped to this range: a channel that is (nearly) never active must
#: not blow its weight column up by 10⁹ (the weight's per-row scale would then crush the rest).
S_MIN, S_MAX = 1e-4, 1e4


def weight_channel_amax(weight: torch.Tensor) -> torch.Tensor:
    """``max_n |W[n, c]|`` per input channel ``c`` of an ``(N, K)`` weight, as fp32 ``(K,)``."""
    return weight.detach().float().abs().amax(dim=0)


def smoothing_factors(act_amax: torch.Tensor, weight_amax: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's ``s = act_amax^α / weight_amax^(1-α)``, clamped to ``[S_MIN, S_MAX]``.

    Channels where the activation or the weight is all zero get ``s = 1`` (nothing to balance).

    Example:
        >>> smoothing_factors(torch.tensor([4.0, 1.0]), torch.tensor([1.0, 4.0]), 0.5)
        tensor([2.0000, 0.5000])
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    a, w = act_amax.float(), weight_amax.float()
    if a.shape != w.shape:
        raise ValueError(f"activation and weight amax differ in shape: {tuple(a.shape)} vs {tuple(w.shape)}")
    live = (a > 0) & (w > 0)
    s = a.clamp_min(1e-30).pow(alpha) / w.clamp_min(1e-30).pow(1.0 - alpha)
    return torch.where(live, s.clamp(S_MIN, S_MAX), torch.ones_like(s))


def fold(weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``W·diag(s)``: the weight that, fed with ``x / s``, gives the original output (in ``weight``'s dtype)."""
    return weight * s.to(weight.dtype).reshape(1, -1)


def smoothed_amax(channel_amax: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Per-tensor ``max |x / s|`` from per-channel ``max |x|`` (exact; any leading shape)."""
    return (channel_amax.float() / s.float()).amax(dim=-1)


def channel_energy(rms: torch.Tensor, channel_amax: torch.Tensor) -> torch.Tensor:
    """Estimated per-channel mean square ``E[x_c²]`` from the tensor RMS and per-channel amax.

    Calibration records the RMS of the whole input, not per channel; channels are assumed to
    share the shape of their distribution, so ``E[x_c²] ∝ amax_c²`` scaled to the measured
    mean square: ``E[x_c²] = rms² · amax_c² / mean(amax²)``. Exact when channels differ by scale only.
    """
    a2 = channel_amax.float().pow(2)
    mean = a2.mean(dim=-1, keepdim=True).clamp_min(1e-30)
    return torch.as_tensor(rms, dtype=torch.float32).reshape(*a2.shape[:-1], 1).pow(2) * a2 / mean


def smoothed_rms(rms: torch.Tensor, channel_amax: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """RMS of ``x / s`` under :func:`channel_energy`'s estimate (exact when ``s`` is constant)."""
    return (channel_energy(rms, channel_amax) / s.float().pow(2)).mean(dim=-1).sqrt()


def output_error(
    weight: torch.Tensor,
    s: torch.Tensor,
    energy: torch.Tensor,
    act_step: torch.Tensor,
    weight_bits: int,
) -> torch.Tensor:
    """Expected squared output error per token of quantized ``(x/s)·Q(W·diag(s))ᵀ``, relative.

    Two independent noise sources, both in the smoothed domain:

    * weight rounding: ``Σ_c E[(x_c/s_c)²] · Σ_n δW'_{n,c}²`` (``δW'`` the exact rounding error
      of the per-channel symmetric ``weight_bits``-bit weight);
    * activation rounding, uniform over a step ``Δ``: ``Δ²/12 · ‖Q(W')‖²_F``.

    Args:
        weight: ``(N, K)`` full-precision weight.
        s: ``(K,)`` smoothing factors.
        energy: ``(G, K)`` per-channel ``E[x_c²]`` for G groups (time ranges × branches).
        act_step: ``(G,)`` activation quantization step ``Δ`` of each group.
        weight_bits: bits of the weight grid.

    Returns ``(G,)`` errors relative to the output energy ``Σ_c E[x_c²]·‖W_{:,c}‖²``, so groups
    with large activations do not drown the others.
    """
    w = fold(weight.float(), s)
    q = integer.quantize(w, bits=weight_bits, granularity="channel").dequantize()
    dw2 = (q - w).pow(2).sum(dim=0)  # (K,)
    e = energy.float()
    weight_term = (e / s.float().pow(2) * dw2).sum(dim=-1)
    act_term = act_step.float().pow(2) / 12 * q.pow(2).sum()
    signal = (e * weight.float().pow(2).sum(dim=0)).sum(dim=-1).clamp_min(1e-30)
    return (weight_term + act_term) / signal
