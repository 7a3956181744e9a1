"""Fit DMPQ's error predictor ``E_t = α·Γ_{t−1} + β`` per block, and its threshold.

For every block call of the calibration runs, the block is first run as usual with
full-precision activations (the reference ``y``), then once more with NVFP4 activations
(``y_low``). The quantization error is ``E = ‖y_low − y‖₁ / ‖y − x‖₁``: the share of the
block's own contribution (its residual) that NVFP4 activations corrupt. ``Γ`` is
``‖y − x‖₁ / ‖x‖₁``. Pairs ``(Γ_{t−1}, E_t)`` of consecutive steps of one sample feed a
least-squares line per block. The threshold is then the predicted error below which blocks
go NVFP4 so that the FLOP-weighted average activation width of the calibration runs equals
``target_bits`` (steps without ``Γ_{t−1}`` count as INT8).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import nn

from ..models import iter_blocks, spec_for
from ..nn import ActMode
from ..runtime.context import track_steps
from ..runtime.dmpq import ACT_BITS, DMPQConfig, DMPQPredictor
from ..runtime.measure import quant_linears, relative_l1

logger = logging.getLogger(__name__)


def _line(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Least-squares ``y ≈ α·x + β`` (a flat line when x does not vary)."""
    if x.numel() < 2 or float(x.var()) == 0:
        return 0.0, float(y.mean()) if y.numel() else 0.0
    xm, ym = x.mean(), y.mean()
    alpha = ((x - xm) * (y - ym)).sum() / ((x - xm) ** 2).sum()
    return float(alpha), float(ym - alpha * xm)


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.numel() < 3 or float(x.std()) == 0 or float(y.std()) == 0:
        return float("nan")
    return float(torch.corrcoef(torch.stack([x, y]))[0, 1])


def fit_dmpq(model: nn.Module, run: Callable[[], object], config: DMPQConfig | None = None) -> DMPQPredictor:
    """Run ``run()`` (calibration generations) on the quantized ``model`` and fit the predictor.

    Example:
        >>> predictor = fit_dmpq(pipe.transformer, lambda: pipe(prompts, num_inference_steps=20))  # doctest: +SKIP
        >>> predictor.pearson_r                                                                     # doctest: +SKIP
    """
    config = config or DMPQConfig()
    spec = spec_for(model)
    tracker = track_steps(model)
    tracker.new_generation()
    blocks = list(iter_blocks(model, spec))
    layers = {index: quant_linears(block) for index, _, block, _ in blocks}
    if not all(layers.values()):
        raise ValueError("fit_dmpq needs a quantized model: run sixbit.quantize(model, ...) first")
    saved = {id(m): m.act_mode for ls in layers.values() for m in ls}
    calls: list[dict] = []  # one record per block call
    handles = []

    def hooks(index, io):
        pending = {}

        def pre(module, args, kwargs):
            pending["call"] = (args, kwargs, io.stream_input(module, args, kwargs))

        def post(module, args, kwargs, output):
            args, kwargs, x = pending.pop("call")
            y = io.stream_output(output)
            for layer in layers[index]:
                layer.act_mode = ActMode.NVFP4
            try:
                y_low = io.stream_output(module.forward(*args, **kwargs))
            finally:
                for layer in layers[index]:
                    layer.act_mode = ActMode.FP
            info = tracker.info
            tokens = x.numel() // x.shape[-1]
            calls.append({
                "key": (info.generation, info.branch), "block": index, "step": info.step,
                "gamma": relative_l1(y - x, x), "error": relative_l1(y_low - y, y - x),
                "flops": sum(2.0 * tokens * m.in_features * m.out_features for m in layers[index]),
            })
        return pre, post

    try:
        for m in (m for ls in layers.values() for m in ls):
            m.act_mode = ActMode.FP
        for index, _, block, io in blocks:
            pre, post = hooks(index, io)
            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(block.register_forward_hook(post, with_kwargs=True))
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
        for m in (m for ls in layers.values() for m in ls):
            m.act_mode = saved[id(m)]
        tracker.new_generation()
    if not calls:
        raise ValueError("DMPQ calibration recorded nothing: `run` never called the model")

    previous = {(c["key"], c["block"], c["step"]): c for c in calls}
    pairs = []  # (call, Γ_{t−1} per sample)
    for c in calls:
        prev = previous.get((c["key"], c["block"], c["step"] - 1))
        if prev is not None and prev["gamma"].shape == c["gamma"].shape:
            pairs.append((c, prev["gamma"]))
    n_blocks = len(blocks)
    alpha, beta = [0.0] * n_blocks, [0.0] * n_blocks
    for b in range(n_blocks):
        g = torch.cat([gp for c, gp in pairs if c["block"] == b]) if pairs else torch.empty(0)
        e = torch.cat([c["error"] for c, _ in pairs if c["block"] == b]) if pairs else torch.empty(0)
        alpha[b], beta[b] = _line(g, e)
    all_g = torch.cat([gp for _, gp in pairs]) if pairs else torch.empty(0)
    all_e = torch.cat([c["error"] for c, _ in pairs]) if pairs else torch.empty(0)
    predictor = DMPQPredictor([name for _, name, _, _ in blocks], alpha, beta, float("inf"), _pearson(all_g, all_e))
    predictor.threshold = config.threshold if config.threshold is not None else _threshold(predictor, pairs, calls, config)
    logger.info("DMPQ predictor: r = %.3f, threshold = %.4g", predictor.pearson_r, predictor.threshold)
    return predictor


def _threshold(predictor: DMPQPredictor, pairs, calls, config: DMPQConfig) -> float:
    """Smallest threshold whose NVFP4 FLOP share brings the calibration runs to ``target_bits``."""
    low, high = ACT_BITS[ActMode.NVFP4], ACT_BITS[ActMode.INT8]
    total = sum(c["flops"] for c in calls)
    needed = total * (high - config.target_bits) / (high - low)
    candidates = sorted(
        (float(predictor.predict(c["block"], gp).max()), c["flops"]) for c, gp in pairs
    )
    done = 0.0
    for predicted, flops in candidates:
        if done >= needed:
            return predicted - 1e-12 if predicted > 0 else 0.0
        done += flops
    if done < needed:
        logger.warning(
            "target_bits=%.2f is out of reach: even with NVFP4 wherever Γ_{t-1} is known the average is "
            "%.2f bits; every such block goes NVFP4", config.target_bits, (low * done + high * (total - done)) / total,
        )
    return float("inf")
