"""Run methods side by side through one pipeline, the same prompts, seeds and steps, and measure.

Per method (:func:`run_bench`):

1. load a fresh pipeline and apply the method (``setup_s``: conversion, calibration);
2. one warm-up generation of all prompts, with the work counters installed
   (:mod:`sixbit.bench.counting`) and peak memory tracked: its videos are the ones judged;
3. ``runs`` timed generations without counters: ``s_per_video`` is the median / prompts.
   Just before them, one generation of each reference is timed as well — FP (fp32) and the
   speed baseline, the fastest full-precision dtype of the machine
   (:func:`sixbit.kernels.fastest_float_dtype`: ``bf16`` on CPUs with AVX512-BF16 or AMX, else
   ``fp``). ``speedup`` is the median of the baseline's generations timed nearest the method's
   runs (:func:`speedups`) over the method's median, so a shared machine's drifting load cancels
   out; ``speedup_fp32`` the same against FP. The references are timed at the start and again at the end.

Quality is measured against the FP method's videos of the same seeds (PSNR, SSIM), flicker
and adherence by the shapes judge (:mod:`sixbit.zoo.shapes.judge`). The GPU projection
(:mod:`sixbit.bench.gpu_model`) compares each run's counted work with the FP run's.

Example:
    >>> from sixbit.bench.harness import BenchSettings, run_bench
    >>> result = run_bench(BenchSettings("shapes-wan", ["fp", "tdc"], prompts=2, steps=4))  # doctest: +SKIP
    >>> result.rows[1]["speedup"]                                                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from ..pipelines import SHAPES_CLASSES, SHIPPED
from ..zoo.shapes import heldout_pairs
from . import gpu_model, layer_shapes
from .counting import WorkCounter
from .footprint import model_bytes, peak_memory
from .machine import machine_description
from .methods import BenchContext, resolve

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class BenchSettings:
    """What to run.

    Args:
        model: ``"shapes-cogvideox"``, ``"shapes-wan"`` or the folder of a saved shapes pipeline.
        methods: ``--methods`` names (:mod:`sixbit.bench.methods`); ``"fp"`` always runs first (the
            reference of quality), the speed baseline second.
        prompts: held-out (prompt, seed) pairs, spread over the 48 (default 8).
        steps: denoising steps (default 20). guidance: CFG scale (default 4.0).
        runs: timed generations per method after the warm-up; the median counts (default 3, ≥ 3).
        calibration_prompts: prompts (own seeds) for methods that calibrate (default 8).
        video_prompts: prompts whose videos the HTML page shows per method (default 2).
        baseline: the method speedups are quoted against, ``"bf16"`` or ``"fp"`` (default: the
            fastest full-precision dtype of this machine's CPU, :func:`speed_baseline`).
    """

    model: str
    methods: list[str]
    prompts: int = 8
    steps: int = 20
    guidance: float = 4.0
    runs: int = 3
    calibration_prompts: int = 8
    video_prompts: int = 2
    baseline: str | None = None

    def __post_init__(self):
        if self.baseline is None:
            self.baseline = speed_baseline()
        problems = []
        if not 1 <= self.prompts <= 48:
            problems.append(f"prompts must be in 1..48 (the held-out pairs), got {self.prompts}")
        if self.steps < 2:
            problems.append(f"steps must be ≥ 2, got {self.steps}")
        if self.runs < 3:
            problems.append(f"runs must be ≥ 3 (the median of at least three timed runs), got {self.runs}")
        if self.calibration_prompts < 1:
            problems.append(f"calibration_prompts must be ≥ 1, got {self.calibration_prompts}")
        if not self.methods:
            problems.append("methods is empty; e.g. fp,w8a8-static,balanced,fbcache-0.2")
        if self.baseline not in REFERENCES:
            problems.append(f"baseline must be one of {REFERENCES}, got {self.baseline!r}")
        if problems:
            raise ValueError("invalid bench settings: " + "; ".join(problems))
        names = list(dict.fromkeys(m.strip() for m in self.methods if m.strip()))
        first = list(dict.fromkeys(["fp", self.baseline]))  # the references run first
        self.methods = first + [m for m in names if m not in first]


REFERENCES = ("fp", "bf16")  # the full-precision methods speedups can be quoted against


def speed_baseline() -> str:
    """The harness's speed baseline on this CPU: ``"bf16"`` where the CPU multiplies bf16 natively
    (what a user who wants speed runs there), else ``"fp"`` (fp32)."""
    from ..kernels import fastest_float_dtype

    return "bf16" if fastest_float_dtype("cpu") == torch.bfloat16 else "fp"


@dataclasses.dataclass
class BenchResult:
    settings: BenchSettings
    arch: str
    machine: str
    rows: list[dict]  # one per method, JSON-ready
    prompts: list[str]
    videos: dict[str, np.ndarray]  # method → (video_prompts, F, H, W, 3)
    grids: dict[str, tuple[list[int], list[list[str]]]]  # method → (steps, step × block map)
    judge_check: float | None  # adherence of clean renders of the prompts (the judge's ceiling)
    total_seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "settings": dataclasses.asdict(self.settings), "arch": self.arch, "machine": self.machine,
            "prompts": self.prompts, "judge_check": self.judge_check, "total_seconds": self.total_seconds,
            "projection": gpu_model.LABEL, "rows": _plain(self.rows),
        }


def _plain(value):
    """JSON-safe copy: non-finite floats become strings ("inf", "nan")."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value


def resolve_model(model: str) -> tuple[str, Path | None]:
    """(arch, weights folder or None for the shipped weights) of ``--model``."""
    if model in SHIPPED:
        return SHIPPED[model], None
    folder = Path(model)
    index = folder / "model_index.json"
    if not index.is_file():
        raise ValueError(
            f"--model {model!r} is neither {' nor '.join(SHIPPED)} nor a pipeline folder with model_index.json"
        )
    cls = json.loads(index.read_text()).get("_class_name")
    if cls not in SHAPES_CLASSES:
        raise ValueError(
            f"{folder} holds a {cls}; the harness runs shapes pipelines (saved by the shapes training script), "
            f"i.e. one of {sorted(SHAPES_CLASSES)}"
        )
    return SHAPES_CLASSES[cls], folder


def calibration_pairs(n: int) -> list[tuple[str, int]]:
    """``n`` zoo prompts with seeds 20 000+ (never used for evaluation), balanced: each color, shape
    and direction appears as evenly as ``n`` allows (the ``i``-th pair takes color ``i mod 4``, shape
    ``i mod 3``, direction ``(i + i // 4) mod 4``), because a video's error under quantization depends
    strongly on its color (blue objects score ~3 dB above the mean, yellow ones ~3 dB below), so an
    unbalanced handful of prompts misjudges what unseen prompts will get."""
    from ..zoo.shapes import COLORS, DIRECTIONS, SHAPES

    colors, directions = list(COLORS), list(DIRECTIONS)
    return [(f"a {colors[i % len(colors)]} {SHAPES[i % len(SHAPES)]} moving "
             f"{directions[(i + i // len(directions)) % len(directions)]}", 20_000 + i) for i in range(n)]


class _Runner:
    def __init__(self, settings: BenchSettings):
        from ..zoo.shapes import load_pipeline

        self.settings = settings
        self.arch, self.folder = resolve_model(settings.model)
        self._load = lambda: load_pipeline(self.arch, path=self.folder)
        self.pairs = heldout_pairs(settings.prompts)
        self.calib = calibration_pairs(settings.calibration_prompts)
        self.context = BenchContext(self.arch, settings.steps, settings.guidance, self.calibrate, len(self.calib))
        self.references: dict[str, object] = {}  # "fp" and the speed baseline → their pipelines

    def generate(self, pipe, pairs=None) -> np.ndarray:
        from ..zoo.shapes.judge import generate_heldout

        videos, _ = generate_heldout(pipe, pairs or self.pairs, self.settings.steps, self.settings.guidance)
        return videos

    def calibrate(self, pipe):
        return self.generate(pipe, self.calib)

    def measure(self, name: str, reference: np.ndarray | None):
        method, value = resolve(name)
        row = {"method": name, "family": method.family, "description": method.description,
               "emulated": method.emulated, "status": "ok", "note": ""}
        reason = method.unavailable()
        if reason is not None:
            row.update(status="could not run", note=reason)
            return row, None, None
        pipe = self._load()
        t0 = time.perf_counter()
        try:
            row["note"] = method.apply(pipe, self.context, value)
        except Exception as e:  # noqa: BLE001 - a peer that fails here is listed with its reason
            logger.warning("%s failed to apply: %s", name, e)
            row.update(status="failed", note=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return row, None, None
        row["setup_s"] = time.perf_counter() - t0
        from ..runtime import track_steps

        track_steps(pipe.transformer)  # step/branch for the maps (the methods that need it have one)
        counter = WorkCounter(pipe.transformer, method.precision_of)
        mem: dict = {}
        try:
            with torch.no_grad(), peak_memory(mem), counter:
                videos = self.generate(pipe)
        except Exception as e:  # noqa: BLE001
            logger.warning("%s failed to generate: %s", name, e)
            row.update(status="failed", note=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return row, None, None
        finally:
            counter.remove()
        # the references are timed right before every other method's runs (and at the end)
        probes = {ref: self.time_runs(p, 1)[0] for ref, p in self.references.items()}
        if probes:
            row["probes_before"] = probes
        if name in (self.settings.baseline, "fp"):
            self.references[name] = pipe
        times = self.time_runs(pipe)
        work = counter.totals()
        weights = model_bytes(pipe.transformer)
        row.update(
            run_seconds=times,
            s_per_video=statistics.median(times) / len(self.pairs),
            weight_bytes=weights,
            peak_bytes=None if mem["extra_bytes"] is None else weights + mem["extra_bytes"],
            act_bits=work.average_act_bits(),
            skip_share=work.skip_share,
            work=work.to_dict(),
        )
        row.update(self.quality(videos, reference))
        return row, videos, counter.grid()

    def time_runs(self, pipe, runs: int | None = None) -> list[float]:
        times = []
        with torch.no_grad():
            for _ in range(runs or self.settings.runs):
                t0 = time.perf_counter()
                self.generate(pipe)
                times.append(time.perf_counter() - t0)
        return times

    def quality(self, videos, reference) -> dict:
        from ..eval.metrics import psnr, ssim
        from ..zoo.shapes.judge import adherence

        prompts = [p for p, _ in self.pairs]
        adh = adherence(videos, prompts)
        out = {"flicker": adh.flicker, "adherence": adh.accuracy["all"],
               "adherence_attrs": {k: v for k, v in adh.accuracy.items() if k != "all"}}
        if reference is None:
            out.update(psnr=float("inf"), ssim=1.0)
        else:
            out.update(psnr=float(np.mean([psnr(v, r) for v, r in zip(videos, reference)])),
                       ssim=float(np.mean([ssim(v, r) for v, r in zip(videos, reference)])))
        return out

    def judge_check(self) -> float:
        """Adherence of the world's own clean renders of the prompts: the judge's ceiling."""
        from ..zoo.shapes.judge import adherence
        from ..zoo.shapes.world import parse_prompt, render, sample_specs

        videos = [render(sample_specs(1, seed=s, **parse_prompt(p))[0]) for p, s in self.pairs]
        return adherence(videos, [p for p, _ in self.pairs]).accuracy["all"]


PROBE_WINDOW = 2  # reference generations on each side of a method's runs whose median is its reference time


def speedups(rows: list[dict], n_prompts: int, baseline: str, runs: int) -> None:
    """``speedup`` (vs ``baseline``) and ``speedup_fp32`` of every timed row.

    A reference's time next to a method is the median of its :data:`PROBE_WINDOW` generations
    timed nearest before the method's runs and as many after (the probes before the next rows;
    after the last rows, the reference's timings at the end): on a shared machine one slow probe
    (measured: up to 1.6× its neighbours) then cannot move a ratio, while slow drift still cancels.
    """
    timed = [r for r in rows if r["status"] == "ok"]
    refs = {r["method"]: r for r in timed if r["method"] in ("fp", baseline)}
    for r in timed:
        r["s_per_video_nearby"] = {}
    for name, ref in refs.items():
        probed = [r for r in timed if name in r.get("probes_before", {})]
        times = [r["probes_before"][name] for r in probed] + ref["run_seconds"][runs:]
        for j, r in enumerate(probed):
            window = times[max(j - PROBE_WINDOW + 1, 0): j + PROBE_WINDOW + 1]
            r["s_per_video_nearby"][name] = statistics.median(window) / n_prompts
    fp, base = refs["fp"], refs[baseline]
    for r in timed:
        r["speedup_fp32"] = 1.0 if r is fp else r["s_per_video_nearby"]["fp"] / r["s_per_video"]
    for r in timed:
        if r is base:
            r["speedup"] = 1.0
        elif r is fp:
            r["speedup"] = 1.0 / base["speedup_fp32"]
        else:
            r["speedup"] = r["s_per_video_nearby"][baseline] / r["s_per_video"]


def _projections(rows: list[dict], arch: str) -> None:
    timed = [r for r in rows if r["status"] == "ok"]
    fp = next(r for r in timed if r["method"] == "fp")
    fp_work = {"gemm": fp["work"]["gemm_flops"], "attention": fp["work"]["attention_flops"]}
    real = {name: layer_shapes.model_flops(name) for name in layer_shapes.SCALE_OF.get(arch, ())}
    for r in timed:
        work = {"gemm": r["work"]["gemm_flops"], "attention": r["work"]["attention_flops"]}
        r["projection"] = gpu_model.project(fp_work, work, real)


def run_bench(settings: BenchSettings, progress: bool = True) -> BenchResult:
    """Run every method of ``settings`` and return the measured rows (see the module docstring)."""
    from tqdm.auto import tqdm

    for name in settings.methods:  # every name is checked before anything runs
        resolve(name)
    start = time.perf_counter()
    runner = _Runner(settings)
    rows, videos, grids, reference = [], {}, {}, None
    keep = settings.video_prompts
    for name in tqdm(settings.methods, desc=f"bench {settings.model}", disable=not progress):
        row, vids, grid = runner.measure(name, reference)
        if name in (settings.baseline, "fp") and row["status"] != "ok":
            raise RuntimeError(f"the {name} reference failed: {row['note']}")
        if name == "fp":
            reference = vids
        rows.append(row)
        if vids is not None:
            videos[name] = vids[:keep]
            grids[name] = grid
        logger.info("%s: %s", name, {k: v for k, v in row.items() if k not in ("work", "run_seconds")})
    if len(rows) > 1:  # the references again after the others: their times span the whole session
        for row in rows:
            if row["method"] in runner.references:
                row["run_seconds"] += runner.time_runs(runner.references[row["method"]])
                row["s_per_video"] = statistics.median(row["run_seconds"]) / len(runner.pairs)
    speedups(rows, len(runner.pairs), settings.baseline, settings.runs)
    _projections(rows, runner.arch)
    return BenchResult(
        settings, runner.arch, machine_description(), rows, [p for p, _ in runner.pairs], videos, grids,
        runner.judge_check(), time.perf_counter() - start,
    )
