"""Run by ``test_parallel.py`` under ``torchrun --nproc-per-node 2`` (gloo, CPU).

For each shipped model, full precision and quantized, each with the delta cache off and on
(:data:`KINDS`): the single-process video is made first on every rank, then a fresh pipeline is
wrapped in each mode and its video compared with it; the cache's decisions are gathered from
both ranks. A wrapped ``balanced`` model is saved (one file) and loaded into a fresh pipeline on
rank 0; a runtime method
installed after the split is refused; a plain loop calls the wrapped transformer; LoRAs are
loaded before and after each split (:func:`lora_cases`). Rank 0 writes
the measurements to ``argv[1]`` (JSON); the test asserts on them.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import sixbit
from sixbit.eval.metrics import psnr
from sixbit.methods.delta_cache import DeltaCache, DeltaCacheConfig, enable_delta_cache
from sixbit.nn import QuantLinear
from sixbit.parallel import TensorParallelWrapper
from sixbit.presets import resolve
from sixbit.runtime import blocks
from sixbit.zoo.shapes import load_pipeline

STEPS = 10  # the kinds with the delta cache: it skips within these; the others show the split in fewer
FEW_STEPS = 3
CACHE = DeltaCacheConfig(threshold=0.4)  # a threshold at which both models skip blocks within the few steps
BALANCED = resolve("balanced")
KINDS = {  # full precision and quantized, each with the delta cache off and on (balanced: DMPQ too)
    "fp": None,
    "fp+cache": dataclasses.replace(resolve("tdc"), cache=CACHE),
    "w4a8-rtn": resolve("w4a8-rtn"),
    "balanced+cache": dataclasses.replace(BALANCED, cache=dataclasses.replace(BALANCED.cache, threshold=0.4)),
}


def build(arch: str, kind: str, folder: Path):
    """A fresh pipeline of ``kind``. ``balanced`` calibrates (GPTQ, DMPQ): converted once per rank
    and model, then loaded from that rank's own checkpoint."""
    pipe = load_pipeline(arch)
    config = KINDS[kind]
    if kind.startswith("balanced"):
        path = folder / f"{arch}-{dist.get_rank()}.safetensors"
        if not path.exists():
            sixbit.convert_model(pipe, lambda: video(pipe, seed=7), config)
            sixbit.save(pipe, path)
        sixbit.load(path, pipe)
    elif config is not None:
        sixbit.convert_model(pipe, None, config)
    return pipe


def video(pipe, seed: int = 0, steps: int = STEPS) -> np.ndarray:
    return pipe(["a red circle moving right"], num_inference_steps=steps, guidance_scale=4.0,
                generator=[torch.Generator().manual_seed(seed)]).frames


def decisions(transformer) -> dict | None:
    cache = next(iter(blocks.attached(transformer, DeltaCache)), None)
    return None if cache is None else {str(k): v for k, v in cache.report().decisions.items()}


def lora_cases(results: dict) -> None:
    """A LoRA on every linear (quantized and full precision) of a ``w4a8-rtn`` Wan: loaded before
    the split, in both modes, and after a sequence split, each output against the single
    process's; loaded after a tensor split: refused (issue 48: it blamed the file)."""
    g = torch.Generator().manual_seed(3)
    inputs = {"hidden_states": torch.randn(2, 3, 4, 32, 32, generator=g), "timestep": torch.tensor([500, 300]),
              "encoder_hidden_states": torch.randn(2, 10, 64, generator=g), "return_dict": False}

    def converted(lora=None):
        pipe = load_pipeline("wan")
        sixbit.convert_model(pipe, None, "w4a8-rtn")
        if lora is not None:
            sixbit.load_lora(pipe, lora)
        return pipe

    ref = converted()
    linears = [(n, m) for n, m in ref.transformer.named_modules() if isinstance(m, (torch.nn.Linear, QuantLinear))]
    lora = {}
    for name, m in linears:
        lora[f"{name}.lora_A.weight"] = torch.randn(2, m.in_features, generator=g) / m.in_features ** 0.5
        lora[f"{name}.lora_B.weight"] = 0.05 * torch.randn(m.out_features, 2, generator=g)
    sixbit.load_lora(ref, lora)
    with torch.no_grad():
        want = ref.transformer(**inputs)[0]
    results["lora/targets"] = sorted({type(m).__name__ for _, m in linears})
    for mode, when in (("tensor", "before"), ("sequence", "before"), ("sequence", "after")):
        pipe = converted(lora if when == "before" else None)
        wrapped = TensorParallelWrapper(pipe, mode=mode)
        if when == "after":
            sixbit.load_lora(pipe, lora)
        with torch.no_grad():
            results[f"lora/{mode}/{when}"] = float((wrapped.transformer(**inputs)[0] - want).abs().max())
        if mode == "sequence":
            wrapped.unwrap()
    pipe = converted()
    TensorParallelWrapper(pipe, mode="tensor")
    try:
        sixbit.load_lora(pipe, lora)
        results["lora/tensor/after"] = "loaded"
    except ValueError as e:
        results["lora/tensor/after"] = str(e)


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}
    folder = Path(tempfile.mkdtemp())
    for arch in ("wan", "cogvideox"):
        for kind in KINDS:
            steps = STEPS if kind.endswith("cache") else FEW_STEPS
            ref_pipe = build(arch, kind, folder)
            ref, ref_decisions = video(ref_pipe, steps=steps), decisions(ref_pipe.transformer)
            ref_bytes = sum(t.numel() * t.element_size() for t in (*ref_pipe.transformer.parameters(),
                                                                    *ref_pipe.transformer.buffers()))
            for mode in ("tensor", "sequence"):
                pipe = TensorParallelWrapper(build(arch, kind, folder), mode=mode)
                got = video(pipe, steps=steps)
                mine = decisions(pipe.transformer)
                every = [None] * dist.get_world_size()
                dist.all_gather_object(every, mine)
                case = {"psnr": float(psnr(got[0], ref[0])), "max_diff": float(np.abs(got - ref).max()),
                        "decisions_agree": all(d == every[0] for d in every),
                        "decisions_as_single": every[0] == ref_decisions,
                        "skips": 0 if mine is None else sum(v == "skip" for v in mine.values()),
                        "bytes_ratio": pipe.weight_bytes() / ref_bytes}
                if kind.startswith("balanced") and mode == "tensor":  # one checkpoint from the split model
                    path = folder / f"split-{arch}.safetensors"
                    sixbit.save(pipe, path)
                    if rank == 0:
                        fresh = load_pipeline(arch)
                        sixbit.load(path, fresh)
                        case["loaded_max_diff"] = float(np.abs(video(fresh, steps=steps) - ref).max())
                if mode == "sequence":
                    pipe.unwrap()
                results[f"{arch}/{kind}/{mode}"] = case
    g = torch.Generator().manual_seed(1)  # a plain loop: the transformer called directly, both modes
    inputs = {"hidden_states": torch.randn(2, 3, 4, 32, 32, generator=g), "timestep": torch.tensor([500, 300]),
              "encoder_hidden_states": torch.randn(2, 10, 64, generator=g), "return_dict": False}
    with torch.no_grad():
        ref = load_pipeline("wan").transformer(**inputs)[0]
        for mode in ("tensor", "sequence"):
            wrapped = TensorParallelWrapper(load_pipeline("wan").transformer, mode=mode)
            results[f"plain/{mode}"] = float((wrapped(**inputs)[0] - ref).abs().max())
            if mode == "sequence":
                wrapped.unwrap()
    wrapped = TensorParallelWrapper(load_pipeline("wan").transformer, mode="sequence")
    try:  # 2 latent frames of 20 × 12: one frame patch of 5 × 3 = 15 tokens, refused by the check
        wrapped(**{**inputs, "hidden_states": torch.randn(2, 3, 2, 20, 12, generator=g)})
        results["odd_tokens_refused"] = False
    except ValueError as e:
        results["odd_tokens_refused"] = "do not split evenly across 2 ranks" in str(e)
    wrapped.unwrap()
    pipe = TensorParallelWrapper(load_pipeline("wan"), mode="sequence")
    enable_delta_cache(pipe.transformer)  # after the split: refused at the call, on every rank
    try:
        video(pipe)
        results["late_method_refused"] = False
    except RuntimeError as e:
        results["late_method_refused"] = "install it first" in str(e)
    pipe.unwrap()
    lora_cases(results)
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
