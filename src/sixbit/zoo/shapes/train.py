"""Train a shapes text-to-video model: ``python -m sixbit.zoo.shapes.train --arch cogvideox|wan``.

Rectified flow (flow matching): ``x_t = (1 - t) x0 + t noise`` at flow times ``t`` in (0, 1)
drawn by :func:`flow_times`, the
transformer predicts the velocity ``noise - x0`` at timestep ``1000 t`` (the convention of
diffusers' ``FlowMatchEulerDiscreteScheduler``). Captions drop to ``""`` with probability
``--cfg-dropout`` so the model also learns the unconditional velocity used by guidance, and half
of the captions name the background. Every training video is drawn fresh from the procedural
world, so there is no data set to download and no overfitting to a fixed set.

Determinism: step ``k`` draws its videos from ``numpy.random.default_rng((seed, k))`` and its
noise from ``torch.Generator().manual_seed(seed * 1_000_003 + k)``; with the same thread count
the run is reproducible, and ``--resume`` continues bit-exactly from a training-state checkpoint.

Shipped weights (``weights/<arch>``): the defaults, run with ``--threads 1`` (both models trained
side by side on 2 shared CPU cores: 97 minutes for cogvideox, 109 for wan, wall time including
the six held-out evaluations)::

    python -m sixbit.zoo.shapes.train --arch cogvideox --threads 1
    python -m sixbit.zoo.shapes.train --arch wan --threads 1

The recipe (each option is a default; BENCHMARKS.md, section shapes-adherence, has the learning
curve): objects 13-16 px across (``--size LOW HIGH``; 3-4 patches of 4x4, so corners are more than
sub-patch detail) on trajectories centered within 3 px (``--jitter PX``); ``--timesteps
logit-normal`` with ``--t-mean 1`` (train the noisy times, where shape and motion are decided,
more) and ``--uniform-fraction 0.3`` (a uniform share for the clean end); ``--object-weight 4``
(extra loss weight on the object's pixels); 9000 steps with EMA 0.999. The models learn color
first, then motion, and shape last. ``--eval-pairs 48`` judges each saved checkpoint on the
held-out pairs and writes the adherence learning curve into ``training.json`` (0 turns it off).
To train further, resume with a longer schedule, e.g. ``--steps 12000 --resume`` (the learning
rate then follows the longer cosine from the resumed step).

Stopping: Ctrl-C or SIGTERM saves the state and the EMA weights reached so far (``--resume``
continues); ``--stop-at N`` does the same at a chosen step.

The output folder receives the EMA weights as a ``save_pretrained`` pipeline (float16
safetensors, to keep the shipped package small) plus ``training.json`` (the arguments). The
training state (float32 weights, EMA, AdamW moments; for ``--resume``) goes to ``--state``,
outside the package so that it never ships.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ...files.atomic import write_text_atomic
from . import WEIGHTS_DIR, make_pipeline
from .models import predict_velocity
from .world import JITTER, SIZE_RANGE, render, sample_specs

logger = logging.getLogger(__name__)


def training_batch(step: int, seed: int, batch_size: int, cfg_dropout: float, size_range=SIZE_RANGE,
                   jitter: float | None = JITTER):
    """(videos in [-1, 1] (B, F, 3, H, W), captions) for training step ``step``."""
    rng = np.random.default_rng((seed, step))
    specs = sample_specs(batch_size, seed=int(rng.integers(2**62)), size_range=tuple(size_range), jitter=jitter)
    captions = []
    for spec in specs:
        if rng.random() < cfg_dropout:
            captions.append("")
        else:
            captions.append(spec.prompt(with_background=bool(rng.random() < 0.5)))
    return render(specs) * 2 - 1, captions


def flow_times(b: int, generator, kind: str = "uniform", mean: float = 0.0, uniform_fraction: float = 0.0) -> torch.Tensor:
    """``b`` flow times in (0, 1): ``"uniform"``, or ``"logit-normal"`` (sigmoid of a normal with
    ``mean`` and SD 1: trains the middle times, where layout and shape are decided, more than the
    ends; ``mean > 0`` leans toward the noisy end), of which a ``uniform_fraction`` of the batch is
    drawn uniformly instead (the logit-normal alone almost never trains the last, least noisy steps
    of sampling, which clean the background and the object's interior)."""
    if not 0.0 <= uniform_fraction <= 1.0:
        raise ValueError(f"uniform_fraction={uniform_fraction!r} must be in [0, 1]")
    if kind == "uniform":
        return torch.rand(b, generator=generator)
    if kind == "logit-normal":
        t = torch.sigmoid(torch.randn(b, generator=generator) + mean)
        if uniform_fraction > 0:
            pick = torch.rand(b, generator=generator) < uniform_fraction
            t = torch.where(pick, torch.rand(b, generator=generator), t)
        return t
    raise ValueError(f"unknown flow-time distribution {kind!r}; choose 'uniform' or 'logit-normal'")


def object_weights(videos: torch.Tensor, weight: float) -> torch.Tensor:
    """(B, F, 1, H, W) loss weights: ``1 + weight`` on the object and 2 px around it, 1 elsewhere.

    The object is where the clean video is saturated (backgrounds are pure gray). What tells a
    square from a circle is a few corner pixels of a video that is three quarters background; the
    weight makes them count."""
    frames = (videos + 1) / 2
    sat = (frames.amax(dim=2) - frames.amin(dim=2)).flatten(0, 1).unsqueeze(1)  # (B*F, 1, H, W)
    near = torch.nn.functional.max_pool2d((sat > 0.05).float(), 5, stride=1, padding=2)
    return (1 + weight * near).view(videos.shape[0], videos.shape[1], 1, *videos.shape[3:])


def flow_matching_loss(arch, transformer, text_encoder, videos, captions, generator, timesteps: str = "uniform",
                       t_mean: float = 0.0, uniform_fraction: float = 0.0, object_weight: float = 0.0):
    """Mean squared error between predicted and true velocity at flow times drawn by :func:`flow_times`
    (weighted by :func:`object_weights` when ``object_weight > 0``)."""
    b = videos.shape[0]
    t = flow_times(b, generator, timesteps, t_mean, uniform_fraction)
    noise = torch.randn(videos.shape, generator=generator)
    tt = t.view(b, 1, 1, 1, 1)
    x_t = (1 - tt) * videos + tt * noise
    pred = predict_velocity(arch, transformer, x_t, t * 1000, text_encoder.encode(captions))
    if object_weight <= 0:
        return torch.nn.functional.mse_loss(pred, noise - videos)
    w = object_weights(videos, object_weight)
    return ((pred - (noise - videos)).pow(2) * w).sum() / (w.sum() * videos.shape[2])


def _lr(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _save_state(path: Path, step, modules, ema, optimizer):
    tensors = {}
    for name, module in modules.items():
        for k, v in module.state_dict().items():
            tensors[f"model.{name}.{k}"] = v.contiguous()
    for i, e in enumerate(ema):
        tensors[f"ema.{i}"] = e.contiguous()
    for i, p in enumerate(optimizer.param_groups[0]["params"]):
        st = optimizer.state.get(p)
        if st:
            tensors[f"opt.{i}.exp_avg"] = st["exp_avg"].contiguous()
            tensors[f"opt.{i}.exp_avg_sq"] = st["exp_avg_sq"].contiguous()
            tensors[f"opt.{i}.step"] = torch.as_tensor(st["step"]).float().reshape(1)
    save_file(tensors, str(path), metadata={"step": str(step)})


def _load_state(path: Path, modules, ema, optimizer) -> int:
    from safetensors import safe_open

    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        step = int(f.metadata()["step"])
    for name, module in modules.items():
        prefix = f"model.{name}."
        module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
    for i, e in enumerate(ema):
        e.copy_(tensors[f"ema.{i}"])
    for i, p in enumerate(optimizer.param_groups[0]["params"]):
        if f"opt.{i}.exp_avg" in tensors:
            optimizer.state[p] = {
                "step": tensors[f"opt.{i}.step"].reshape(()),
                "exp_avg": tensors[f"opt.{i}.exp_avg"],
                "exp_avg_sq": tensors[f"opt.{i}.exp_avg_sq"],
            }
    return step


def export(pipe, params, ema, out: Path, meta: dict) -> None:
    """Write the EMA weights as a float16 ``save_pretrained`` pipeline into ``out``.

    The cast happens on a copy: casting the training pipeline in place and back would also round
    its float64 buffers (Wan's RoPE tables) through float16 and train on degraded positions."""
    import copy

    from diffusers.utils import logging as diffusers_logging

    backup = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, e in zip(params, ema):
            p.copy_(e)
    snapshot = copy.deepcopy(pipe)
    with torch.no_grad():
        for p, b in zip(params, backup):
            p.copy_(b)
    # diffusers warns about casting with .to(); these modules hold plain fp32 weights, so the fp16
    # copy is exactly what loading with dtype=float16 would give.
    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        snapshot.to(torch.float16).save_pretrained(out, safe_serialization=True)
    finally:
        diffusers_logging.set_verbosity(verbosity)
    write_text_atomic(out / "training.json", json.dumps(meta, indent=2) + "\n")


def _evaluate(arch: str, out: Path, step: int, pairs: int, curve: list) -> None:
    """Judge the weights just exported to ``out`` on ``pairs`` held-out pairs; the point joins
    ``curve`` (the adherence learning curve) and ``training.json``."""
    from sixbit.zoo.shapes.judge import evaluate_pipeline

    from . import heldout_pairs, load_pipeline

    t0 = time.time()
    report = evaluate_pipeline(load_pipeline(arch, path=out), heldout_pairs(pairs))
    point = {"step": step, **{k: round(v, 4) for k, v in report.accuracy.items()}, "flicker": round(report.flicker, 4)}
    curve.append(point)
    meta = json.loads((out / "training.json").read_text())
    meta["adherence"] = curve
    write_text_atomic(out / "training.json", json.dumps(meta, indent=2) + "\n")
    logger.info("step %d: %s (%.0f s)", step, report, time.time() - t0)


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def train(args) -> Path:
    torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else WEIGHTS_DIR / args.arch
    out.mkdir(parents=True, exist_ok=True)
    pipe = make_pipeline(args.arch, seed=args.seed)
    transformer, text_encoder = pipe.transformer, pipe.text_encoder
    modules = {"transformer": transformer, "text_encoder": text_encoder}
    params = [p for m in modules.values() for p in m.parameters()]
    n_params = sum(p.numel() for p in transformer.parameters())
    logger.info("%s: %.2f M transformer parameters", args.arch, n_params / 1e6)
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    ema = [p.detach().clone() for p in params]
    state_path = Path(args.state or Path.home() / ".cache" / "sixbit" / f"shapes-train-{args.arch}.safetensors")
    state_path.parent.mkdir(parents=True, exist_ok=True)
    start = _load_state(state_path, modules, ema, optimizer) if args.resume else 0
    transformer.train()
    t0, losses = time.time(), []
    meta = {k: v for k, v in vars(args).items() if k not in ("out", "state", "resume")}
    meta.update(transformer_parameters=n_params, started_at_step=start)
    old_meta = out / "training.json"
    old = json.loads(old_meta.read_text()) if args.resume and old_meta.is_file() else {}
    curve = [point for point in old.get("adherence", []) if point["step"] <= start]
    meta["adherence"] = curve  # the same list: every export writes the points so far
    # Wall time of the training steps alone (not saving or judging), summed over resumed runs.
    seconds = float(old.get("training_seconds", 0.0))
    done = start
    # SIGTERM (e.g. `kill PID` of a background run, where SIGINT is often ignored) stops cleanly too.
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        for step in range(start, args.steps):
            step_t0 = time.time()
            videos, captions = training_batch(step, args.seed, args.batch_size, args.cfg_dropout, args.size, args.jitter)
            generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
            for group in optimizer.param_groups:
                group["lr"] = _lr(step, args.steps, args.lr, args.warmup)
            loss = flow_matching_loss(args.arch, transformer, text_encoder, videos, captions, generator, args.timesteps, args.t_mean,
                                      args.uniform_fraction, args.object_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            # EMA with a short warm-up: early on the average would be dominated by random weights.
            decay = min(args.ema, (1 + step) / (10 + step))
            with torch.no_grad():
                for e, p in zip(ema, params):
                    e.lerp_(p.detach(), 1 - decay)
            losses.append(loss.item())
            done = step + 1
            seconds += time.time() - step_t0
            meta["training_seconds"] = round(seconds, 3)
            if done % args.log_every == 0 or done == args.steps:
                logger.info(
                    "step %d/%d loss %.4f (mean of last %d) %.3f s/step",
                    done, args.steps, float(np.mean(losses)), len(losses), (time.time() - t0) / len(losses),
                )
                losses, t0 = [], time.time()
            if done % args.save_every == 0 or done == args.steps:
                _save_state(state_path, done, modules, ema, optimizer)
                export(pipe, params, ema, out, {**meta, "step": done})
                logger.info("saved step %d to %s and %s", done, out, state_path)
                if args.eval_pairs:
                    _evaluate(args.arch, out, done, args.eval_pairs, curve)
            if args.stop_at is not None and done >= args.stop_at:
                _save_state(state_path, done, modules, ema, optimizer)
                export(pipe, params, ema, out, {**meta, "step": done, "stopped_at": done})
                logger.info("stopped at step %d of %d (--stop-at); continue with --resume", done, args.steps)
                break
    except KeyboardInterrupt:
        # Stop cleanly: keep what was trained so far, resumable with --resume.
        _save_state(state_path, done, modules, ema, optimizer)
        export(pipe, params, ema, out, {**meta, "step": done, "interrupted": True})
        logger.info("interrupted: saved step %d to %s and %s", done, out, state_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", choices=["cogvideox", "wan"], required=True)
    parser.add_argument("--out", default=None, help="output folder (default: the package's shipped weights)")
    parser.add_argument("--steps", type=int, default=9000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--ema", type=float, default=0.999)
    parser.add_argument("--cfg-dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=float, nargs=2, default=list(SIZE_RANGE), metavar=("LOW", "HIGH"),
                        help="object sizes in px (default: the world's)")
    parser.add_argument("--timesteps", choices=["uniform", "logit-normal"], default="logit-normal",
                        help="flow-time distribution of the training loss")
    parser.add_argument("--t-mean", type=float, default=1.0, help="mean of the logit-normal's normal (> 0: noisier)")
    parser.add_argument("--uniform-fraction", type=float, default=0.3,
                        help="with --timesteps logit-normal: this fraction of each batch draws its time uniformly")
    parser.add_argument("--object-weight", type=float, default=4.0,
                        help="extra loss weight on the object and 2 px around it (0: plain MSE)")
    parser.add_argument("--eval-pairs", type=int, default=48,
                        help="judge every saved checkpoint on this many held-out pairs (48: all; 0: off); "
                             "the learning curve goes into training.json")
    parser.add_argument("--jitter", type=float, default=JITTER,
                        help="trajectory midpoints within this many px of the center (default: the world's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=1500)
    parser.add_argument("--state", default=None, help="training-state file (default ~/.cache/sixbit/shapes-train-ARCH.safetensors)")
    parser.add_argument("--stop-at", type=int, default=None, help="save and stop after this step (resume later)")
    parser.add_argument("--resume", action="store_true", help="continue from the --state file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    train(args)


if __name__ == "__main__":
    main()
