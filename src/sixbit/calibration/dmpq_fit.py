"""Fit DMPQ's error predictor ``E_t = α·Γ_{t−1} + β`` per block, and its threshold.

For every block call of the calibration runs, the block is first run as usual with
full-precision activations (the reference ``y``), then once more with NVFP4 activations
(``y_low``). The quantization error is ``E = ‖y_low − y‖₁ / ‖y‖₁``: the error NVFP4
activations add to the residual stream, relative to it. ``Γ`` is ``‖y − x‖₁ / ‖x‖₁``. Pairs ``(Γ_{t−1}, E_t)`` of consecutive steps of one sample feed a
least-squares line per block. The threshold is then the predicted error below which blocks
go NVFP4 so that the FLOP-weighted average activation width of the calibration runs equals
``target_bits`` (steps without ``Γ_{t−1}`` count as INT8). With ``refine`` (default), the
calibration runs are repeated once with DMPQ switching for real and the threshold is picked
again from the errors predicted then: at run time Γ is measured on mixed-precision blocks, not
on full-precision ones, and this second pass makes the achieved bits match the target.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from torch import nn

from ..models import iter_blocks, spec_for
from ..nn import ActMode
from ..runtime.context import track_steps
from ..runtime.dmpq import ACT_BITS, DMPQConfig, DMPQPredictor, apply_dmpq, remove_dmpq
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


def fit_dmpq(
    model: nn.Module, run: Callable[[], object], config: DMPQConfig | None = None, refine: bool = True
) -> DMPQPredictor:
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
                "gamma": relative_l1(y - x, x), "error": relative_l1(y_low - y, y),
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
    predictor = DMPQPredictor(
        [name for _, name, _, _ in blocks], alpha, beta, float("inf"), _pearson(all_g, all_e), (all_g, all_e)
    )
    if config.threshold is not None:
        predictor.threshold = config.threshold
    else:
        total = sum(c["flops"] for c in calls)
        candidates = [(float(predictor.predict(c["block"], gp).max()), c["flops"]) for c, gp in pairs]
        predictor.threshold = _threshold(candidates, total, config.target_bits)
        if refine:
            predictor.threshold = _refine(model, run, predictor, config.target_bits)
    logger.info("DMPQ predictor: r = %.3f, threshold = %.4g", predictor.pearson_r, predictor.threshold)
    return predictor


def _threshold(candidates: list[tuple[float, float]], total_flops: float, target_bits: float) -> float:
    """Smallest threshold whose NVFP4 FLOP share brings the runs to ``target_bits``.

    ``candidates`` are (predicted error, FLOPs) of the calls where a Γ_{t−1} was known; the
    other calls (``total_flops`` minus theirs) always run INT8.
    """
    low, high = ACT_BITS[ActMode.NVFP4], ACT_BITS[ActMode.INT8]
    needed = total_flops * (high - target_bits) / (high - low)
    done = 0.0
    for predicted, flops in sorted(candidates):
        if done >= needed:
            return predicted - 1e-12 if predicted > 0 else 0.0
        done += flops
    if done < needed:
        logger.warning(
            "target_bits=%.2f is out of reach: even with NVFP4 wherever Γ_{t-1} is known the average is "
            "%.2f bits; every such block goes NVFP4", target_bits, (low * done + high * (total_flops - done)) / total_flops,
        )
    return float("inf")


def _refine(model: nn.Module, run: Callable[[], object], predictor: DMPQPredictor, target_bits: float) -> float:
    """Re-pick the threshold from the errors predicted while DMPQ really switches precision."""
    modes = {id(m): m.act_mode for _, _, block, _ in iter_blocks(model) for m in quant_linears(block)}
    method = apply_dmpq(model, predictor)
    try:
        with torch.no_grad():
            run()
        report = method.report()
    finally:
        remove_dmpq(model)
        for _, _, block, _ in iter_blocks(model):
            for m in quant_linears(block):
                m.act_mode = modes[id(m)]
    return _threshold(report.candidates, sum(report.flops.values()), target_bits)
