"""The ``sixbit convert | generate | eval | info`` commands (the CLI wiring is in :mod:`sixbit.cli`;
argument types and checks in :mod:`sixbit.cli.args`).

Each ``cmd_*`` takes the parsed arguments, prints what a person needs, and returns the exit
code; user mistakes raise ``ValueError`` (one line, exit code 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from .. import checkpoint
from ..memory import fast_path
from ..builder import conversion_device
from ..footprint import summary
from ..convert import conversion_of, convert_model
from ..pipelines import SHAPES_CLASSES, SHIPPED, is_transformer_folder, load_pipeline, shapes_arch
from ..methods.delta_cache import enable_delta_cache
from ..config import Activations, AttentionQuantConfig, DeltaCacheConfig
from ..config.method_types import config_type_of
from ..config.serialize import from_dict
from ..integrations.diffusers.folder import check_apart
from ..integrations.diffusers.reading import load_folder, read_folder_header
from ..presets import PRESETS, calibration_free, for_device, resolve
from ..zoo.shapes import WEIGHTS_DIR
from .streamed import add_restart, convert_streamed
from .args import (DEFAULT_SEED, MAX_SCALE, MAX_STEPS, calibration, call_kwargs, check_output_file,
                   check_output_folder, float_in, guidance_type, int_in, read_prompts, seed_type, steps_type)

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # weight files sixbit never writes

_PIPELINE = "the pipeline folder that holds it (model_index.json beside transformer/)"


def _streamable(args, config) -> bool:
    """A local model folder converted with a calibration-free preset streams block by block; a
    bare transformer folder can only stream (calibration and generation need its pipeline), so
    what it cannot convert is refused here, naming what it can."""
    if args.model in SHIPPED or not Path(args.model).is_dir():
        return False
    if not is_transformer_folder(args.model):
        return not config.needs_calibration and not args.stabilize_frames and args.calib is None
    where = f"--model {args.model!r} is a transformer folder (config.json, no model_index.json)"
    if config.needs_calibration:
        raise ValueError(
            f"{where}: only calibration-free presets stream from it ({', '.join(calibration_free())}), and "
            f"{args.config!r} needs calibration ({config.calibration_reason()}); pass {_PIPELINE} to calibrate on its "
            "generations, or choose one of those presets"
        )
    if args.stabilize_frames:
        raise ValueError(f"{where}: --stabilize-frames does not stream from it; pass {_PIPELINE} to convert in memory, "
                         "or drop the flag")
    return True


def _refuse_transformer_folder(args) -> None:
    """A transformer folder cannot generate: the text encoder, VAE and scheduler are in its pipeline."""
    if is_transformer_folder(args.model):
        raise ValueError(
            f"--model {args.model!r} is a transformer folder (config.json, no model_index.json), which cannot generate "
            f"on its own: pass {_PIPELINE}" + (", with the same --quantized checkpoint" if args.quantized else "")
        )


def _check_convert_output(args) -> bool:
    """Refuse, before anything loads, an output that cannot be written; ``True``: the single-file
    checkpoint (``-o`` ends in ``.safetensors``), ``False``: a diffusers folder."""
    output = Path(args.output)
    if output.suffix == ".safetensors":
        check_output_file(args.output)
        return True
    if output.suffix in _PICKLE_SUFFIXES:
        raise ValueError(f"-o {args.output!r}: give a folder (the converted diffusers folder is written there) or a "
                         f".safetensors file (the single-file checkpoint); sixbit writes no {output.suffix} files")
    check_output_folder(args.output)
    source = WEIGHTS_DIR / SHIPPED[args.model] if args.model in SHIPPED else Path(args.model)
    if source.is_dir():
        check_apart(source, output)
    return False


def _how_to_load(path: Path, model_class: str) -> str:
    """The line that says how to use a converted folder."""
    if (path / "model_index.json").is_file():
        shapes = json.loads((path / "model_index.json").read_text()).get("_class_name") in SHAPES_CLASSES
        load = (f"sixbit.pipelines.load_pipeline({str(path)!r})" if shapes  # diffusers resolves only its own classes
                else f"DiffusionPipeline.from_pretrained({str(path)!r}) after `import sixbit`")
        return f"use it: `sixbit generate --model {path}`, or {load}"
    return (f"use it: {model_class}.from_pretrained({str(path)!r}) after `import sixbit`, or "
            f"`sixbit generate --model PIPELINE --quantized {path}`")


def cmd_convert(args: argparse.Namespace) -> int:
    config = resolve(args.config)
    if args.cache_min_psnr is not None:  # a preset without a cache gets the default one, calibrated (afresh)
        config.cache = dataclasses.replace(config.cache or DeltaCacheConfig(), min_psnr=args.cache_min_psnr, calibrated=None,
                                           max_skip_share=None)
    device = conversion_device(args.device)
    to_file = _check_convert_output(args)
    output = Path(args.output)
    if _streamable(args, config):
        result = convert_streamed(args, config, device, output)
        if not to_file:
            print(_how_to_load(result.path, result.model_class))
        return 0
    pipe = load_pipeline(args.model, progress_bar=True)
    runs_as, hardware = for_device(config, device)  # what convert_model will do there
    if hardware:
        print(hardware)
    calib = calibration(args, pipe) if runs_as.needs_calibration else None
    if runs_as.dmpq is not None and runs_as.dmpq.error_at in ("video", "steps") and isinstance(calib, list):  # not videos
        runs = 3 + runs_as.dmpq.step_groups * (1 if runs_as.dmpq.error_at == "steps" else runs_as.dmpq.block_groups)
        print(f"fitting DMPQ to what NVFP4 costs the videos: the calibration prompts run up to {runs} times")
    t0 = time.perf_counter()
    convert_model(pipe, calib, config, stabilize_frames=args.stabilize_frames, calibration_kwargs=call_kwargs(args),
                  device=device)
    seconds = time.perf_counter() - t0
    if to_file:
        path = checkpoint.save(pipe.transformer, output)
    else:
        pipe.save_pretrained(output)
        path = output
    s = summary(pipe.transformer)
    print(f"converted {args.model} with {args.config!r} on {device} in {seconds:.1f} s: {config.description}")
    print(f"transformer weights {s.bytes_before / 2**20:.2f} MiB -> {s.bytes_after / 2**20:.2f} MiB ({s.compression:.2f}x)")
    conv = conversion_of(pipe)
    if conv.predictor is not None:
        print(f"DMPQ predictor: Pearson r {conv.predictor.pearson_r:.2f}, threshold {conv.predictor.threshold:.4g}")
    if conv.config.cache is not None and conv.config.cache.min_psnr is not None:
        print(f"delta cache: {conv.config.cache.describe()}")
    laid_out = fast_path.planned(pipe)
    if laid_out is not None:
        print(f"run here: {laid_out.describe()}")
    print(f"wrote {path}")
    if not to_file:
        print(_how_to_load(path, type(pipe.transformer).__name__))
    return 0


def _prepare(args):
    """Load the pipeline, then the quantized checkpoint / cache / memory options the flags ask for.

    A checkpoint for a local pipeline folder is loaded onto a meta-device transformer
    (:func:`sixbit.load_pretrained`), a converted folder's transformer restored by ``from_pretrained``:
    the full-precision transformer weights are never read."""
    if args.quantized and Path(args.quantized).is_dir():
        pipe = load_pipeline(args.model, progress_bar=True, transformer=load_folder(args.quantized, torch_dtype=torch.float32))
    elif args.quantized and Path(args.model).is_dir():
        from ..streaming import load_pretrained

        pipe = load_pipeline(args.model, progress_bar=True, transformer=load_pretrained(args.quantized, args.model))
    else:
        pipe = load_pipeline(args.model, progress_bar=True)
        if args.quantized:
            checkpoint.load(args.quantized, pipe)
    fast_path.attach(pipe, args.layout)  # a converted model's layout, decided at its first call (sixbit.memory.fast_path)
    if getattr(args, "cache", "none") == "tdc" and (conversion_of(pipe) is None or conversion_of(pipe).cache is None):
        enable_delta_cache(pipe.transformer, DeltaCacheConfig(error_budget=args.cache_budget))
    if getattr(args, "use_cpu_offload", False) or getattr(args, "tile_size", None) is not None:
        from ..memory import enable_memory_optimization

        mode = "cpu_offload" if args.use_cpu_offload else "none"
        print(enable_memory_optimization(pipe, tile_size=256 if args.tile_size is None else args.tile_size, mode=mode))
    return pipe


def _emulation_note(pipe) -> str:
    """A label for timings of a conversion whose NVFP4 activations are emulated (dequantize + fp32 matmul)."""
    conv = conversion_of(pipe)
    if conv is not None and conv.config.activations in (Activations.NVFP4, Activations.DYNAMIC):
        return " (NVFP4 activations EMULATED here: not FP4 hardware speed)"
    return ""


def _frames(pipe, prompts, seed: int, kwargs: dict) -> np.ndarray:
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    out = pipe(prompts, generator=gens, output_type="np", **kwargs).frames
    return np.asarray(out)


def cmd_generate(args: argparse.Namespace) -> int:
    from ..eval.media import write_video

    check_output_file(args.output, video=True)  # before the pipeline loads
    _refuse_transformer_folder(args)
    pipe = _prepare(args)
    t0 = time.perf_counter()
    video = _frames(pipe, [args.prompt], args.seed, call_kwargs(args))[0]
    seconds = time.perf_counter() - t0
    written = write_video(video, args.output, scale=args.scale)
    line = f"generated {video.shape[0]} frames in {seconds:.1f} s{_emulation_note(pipe)} -> {written}"
    conv = conversion_of(pipe)
    if conv is not None and conv.cache is not None:
        line += f" (blocks skipped: {conv.cache.report().skip_share:.0%})"
    print(line)
    if shapes_arch(pipe):
        from ..zoo.shapes.judge import judge_video

        print(f"judge: {judge_video(video)}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..eval.metrics import psnr, ssim

    if (args.quantized is None) == (args.config is None):
        raise ValueError("give exactly one of --quantized FILE (a converted checkpoint) or --config PRESET (convert now)")
    _refuse_transformer_folder(args)
    prompts = read_prompts(args.prompts_file) if args.prompts_file else None
    reference = load_pipeline(args.model)
    arch = shapes_arch(reference)
    if prompts is None:
        if arch is None:
            raise ValueError("--prompts-file is required for this model (one prompt per line)")
        from ..zoo.shapes import heldout_pairs

        prompts = [p for p, _ in heldout_pairs(args.prompts)]
    kwargs = call_kwargs(args)
    t0 = time.perf_counter()
    ref = np.concatenate([_frames(reference, [p], args.seed + i, kwargs) for i, p in enumerate(prompts)])
    t_ref = time.perf_counter() - t0
    pipe = _prepare(args)
    if args.config:
        convert_model(pipe, calibration(args, pipe) if resolve(args.config).needs_calibration else None,
                      args.config, calibration_kwargs=kwargs)
    t0 = time.perf_counter()
    out = np.concatenate([_frames(pipe, [p], args.seed + i, kwargs) for i, p in enumerate(prompts)])
    t_out = time.perf_counter() - t0
    result = {
        "videos": len(prompts),
        "psnr_db": float(np.mean([psnr(a, b) for a, b in zip(out, ref)])),
        "ssim": float(np.mean([ssim(a, b) for a, b in zip(out, ref)])),
        "seconds_per_video": {"reference": t_ref / len(prompts), "converted": t_out / len(prompts)},
        "emulated": bool(_emulation_note(pipe)),
    }
    if arch:
        from ..zoo.shapes.judge import adherence

        ref_adh, out_adh = adherence(list(ref), prompts), adherence(list(out), prompts)
        result["adherence"] = {"reference": ref_adh.accuracy, "converted": out_adh.accuracy}
        result["flicker"] = {"reference": ref_adh.flicker, "converted": out_adh.flicker}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{len(prompts)} videos, converted vs full precision (same seeds and steps):")
    print(f"  PSNR {result['psnr_db']:.2f} dB   SSIM {result['ssim']:.4f}")
    print(f"  time per video {t_ref / len(prompts):.2f} s -> {t_out / len(prompts):.2f} s{_emulation_note(pipe)}")
    if arch:
        for name in ("reference", "converted"):
            acc = result["adherence"][name]
            print(f"  {name:<10} adherence: color {acc['color']:.0%} shape {acc['shape']:.0%} "
                  f"direction {acc['direction']:.0%}; flicker {result['flicker'][name]:.4f}")
    return 0


def _method_line(name: str, value) -> str:
    """A stored runtime method's config in words (its ``describe()``), else as stored (a method
    this sixbit does not know, or a config it refuses: loading the file would say why)."""
    try:
        config = from_dict(config_type_of(name), value)
    except (ValueError, TypeError):
        return json.dumps(value)
    return config.describe() if callable(getattr(config, "describe", None)) else json.dumps(value)


def cmd_info(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.is_dir():
        header, folder = read_folder_header(path)
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        kind = "converted diffusers folder" + (f" ({folder.relative_to(path)}/)" if folder != path else "") + ", "
    else:
        header, size, kind = checkpoint.read_header(path), path.stat().st_size, ""
    if args.json:
        print(json.dumps(header, indent=2))
        return 0
    layers = header["layers"]
    by_format = Counter(cfg["weight_format"] for cfg in layers.values())
    print(f"{args.path}: {kind}sixbit checkpoint v{header['format_version']} (written by sixbit "
          f"{header['sixbit_version']}), {size / 2**20:.2f} MiB")
    print(f"model: {header['model_class']}; {len(layers)} quantized linears: "
          + ", ".join(f"{n} × {f}" for f, n in sorted(by_format.items())))
    conv = header.get("extensions", {}).get("conversion")
    if conv:
        cfg = conv["config"]
        attention = cfg.get("attention")
        cache = DeltaCacheConfig.from_dict(cfg["cache"]).describe() if cfg["cache"] else "off"
        print(f"conversion: activations {cfg['activations']}; delta cache {cache}"
              + (f"; INT8 attention ({AttentionQuantConfig(**attention).describe()})" if attention else "")
              + (f"; frame stabilizer (dead zone {conv['stabilize_frames']})" if conv.get("stabilize_frames") is not None else ""))
        for name, value in (cfg.get("methods") or {}).items():
            print(f"  runtime method {name}: {_method_line(name, value)}")
        if cfg.get("description"):
            print(f"  {cfg['description']}")
        if conv.get("calibration"):
            print(f"  calibrated on {json.dumps(conv['calibration'])}")
        if conv.get("hardware"):
            print(f"  {conv['hardware']}")
        if conv.get("predictor"):
            p = conv["predictor"]
            print(f"  DMPQ predictor over {len(p['blocks'])} blocks, threshold {p['threshold']:.4g}")
    for name in header.get("extensions", {}):
        if name != "conversion":
            print(f"runtime state: {name}")
    shapes = [(c["out_features"], c["in_features"], "weight_only" if c.get("weight_only") else "gemm") for c in layers.values()]
    print(f"run here: {fast_path.decide(shapes, 'cuda' if torch.cuda.is_available() else 'cpu').describe()} (the file is device-neutral: each device gets its own)")
    print(f"sha256 {header['sha256'][:16]}… (verified on load)")
    return 0


def register(sub) -> None:
    """Add convert, generate, eval and info to the ``sixbit`` sub-command parser."""
    model_help = "shapes-cogvideox, shapes-wan, a save_pretrained folder or a Hugging Face Hub id"
    p = sub.add_parser("convert", help="convert a model with a preset or JSON config and save it",
                       description="Quantize and calibrate a diffusers video model, then save it. By default -o is a "
                       "folder and gets a diffusers folder: the whole pipeline with its transformer converted, or, for a "
                       "transformer folder (config.json + safetensors), the converted transformer alone; "
                       "DiffusionPipeline.from_pretrained (or the model class's) restores it once sixbit is imported. "
                       "-o ending in .safetensors writes the single-file checkpoint instead (sixbit.load; "
                       "generate --quantized). A local model or pipeline folder with a calibration-free preset (w8a8, "
                       "w4a8-rtn, ...) is converted block by block straight from its safetensors shards: memory stays "
                       "near one block, whatever the model's size. A bare transformer folder (no model_index.json) takes only "
                       "those presets.")
    p.add_argument("--model", required=True, help=model_help)
    p.add_argument("--config", default="balanced", help=f"preset ({', '.join(PRESETS)}) or a .json file (default balanced)")
    p.add_argument("--calib", help="calibration: a text file with one prompt per line or a folder of videos "
                   "(default for the shapes models: 8 of their prompts)")
    p.add_argument("--steps", type=steps_type, help=f"sampling steps of the calibration runs, 1-{MAX_STEPS} "
                   "(default: the pipeline's)")
    p.add_argument("--stabilize-frames", nargs="?", type=float_in(0.0, 100.0), const=True, default=False, metavar="DEADZONE",
                   help="steadier frames: temporal mean and deviation apart, near-still tokens held (default dead zone 0.3)")
    p.add_argument("-o", "--output", required=True, metavar="PATH",
                   help="a folder: the diffusers folder (pipeline, or transformer for a transformer folder); "
                   "or FILE.safetensors: the single-file checkpoint")
    p.add_argument("--device", help="where the conversion computes: cpu, cuda or cuda:N (default: the GPU where there "
                   "is one, else the CPU); a streamed conversion takes one block at a time to it")
    p.add_argument("--cache-min-psnr", type=float_in(0.0, 200.0), metavar="DB", help="calibrate the delta cache to DB "
                   "against the uncached full-precision model: its fastest error budget that reaches it, with the share of steps "
                   "skipped capped at the calibration's (adds a cache)")
    add_restart(p)
    p.set_defaults(func=cmd_convert)

    def add_runtime(p):
        p.add_argument("--model", required=True, help=model_help)
        p.add_argument("--quantized", help="what `sixbit convert` wrote: a .safetensors checkpoint or a converted "
                       "folder, model or pipeline (default: full precision)")
        p.add_argument("--steps", type=steps_type, help=f"sampling steps, 1-{MAX_STEPS} (default: the pipeline's)")
        p.add_argument("--guidance", type=guidance_type,
                       help="CFG scale ≥ 0; ≤ 1 turns guidance off (default: the pipeline's)")
        p.add_argument("--seed", type=seed_type, default=DEFAULT_SEED, help="noise seed, 0 to 2**63-1 (default 0)")
        p.add_argument("--cache", choices=["none", "tdc"], default="none", help="skip stable blocks with the delta cache")
        p.add_argument("--cache-budget", type=float_in(0.0, 100.0), default=DeltaCacheConfig().error_budget, help="the delta "
                       "cache's error budget, its one knob: larger skips more (default %(default)g: half the block calls)")
        p.add_argument("--use-cpu-offload", action="store_true", help="keep the model on the CPU, move it to the accelerator per module")
        p.add_argument("--tile-size", type=int_in(8, 16384, multiple_of=8),
                       help="VAE tile size in pixels, a multiple of 8 (pipelines with a VAE; default 256 when tiling)")
        p.add_argument("--layout", choices=fast_path.CHOICES, help="what a converted model keeps resident to run fast "
                       "here: auto (default, or $SIXBIT_LAYOUT: the fastest measured layout where it fits in memory), "
                       "fast, or compact (the stored low-bit weights alone)")

    p = sub.add_parser("generate", help="generate a video, optionally with a converted checkpoint",
                       description="Generate one video and write it as MP4 (GIF without an encoder).")
    add_runtime(p)
    p.add_argument("--prompt", required=True, help="the text prompt")
    p.add_argument("--scale", type=int_in(1, MAX_SCALE), default=1,
                   help=f"nearest-neighbour upscale factor of the written video, 1-{MAX_SCALE} (default 1)")
    p.add_argument("-o", "--output", default="video.mp4", help="output file (default video.mp4)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("eval", help="quality of a converted model vs full precision on a prompt set",
                       description="PSNR/SSIM vs the full-precision videos (same seeds), timing, and on the shapes models "
                       "adherence and flicker judged by sixbit.zoo.shapes.judge.")
    add_runtime(p)
    p.add_argument("--config", help="convert now with this preset or .json instead of --quantized")
    p.add_argument("--calib", help="calibration prompts file or video folder for --config")
    p.add_argument("--prompts", type=int_in(1, 48), default=8, help="held-out prompts of a shapes model, 1-48 (default 8)")
    p.add_argument("--prompts-file", help="prompts to evaluate, one per line")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("info", help="describe a sixbit checkpoint or converted folder",
                       description="Print what a sixbit checkpoint holds: a .safetensors file, or a converted diffusers "
                       "folder (a model folder, or a pipeline folder: its transformer).")
    p.add_argument("path", help="a .safetensors file written by sixbit, or a folder written by `sixbit convert` "
                   "or a converted model's save_pretrained")
    p.add_argument("--json", action="store_true", help="print the whole JSON header")
    p.set_defaults(func=cmd_info)
