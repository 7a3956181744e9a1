"""``sixbit tune``: per-layer weight formats for a size or quality target, written as a config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..tuning.search import MAX_GENERATIONS, MAX_POPULATION, MIN_POPULATION
from ..tuning.targets import SENSITIVITY_MODES
from .args import calibration, call_kwargs, check_output_file, float_in, int_in, seed_type, steps_type

#: The exit code of a run whose --min-psnr was not reached (the best config found is written all the same).
NOT_REACHED = 3

_EPILOG = (f"exit codes: 0 the target was met and the config written; {NOT_REACHED} --min-psnr was not reached: the "
           "best config found is written all the same, its description marked \"(NOT reached)\"; 2 bad input "
           "(nothing written); 1 an unexpected error.")


def _tuned(args: argparse.Namespace, target: dict, formats: list | None):
    """The :class:`~sixbit.tuning.TuneReport` of the run ``args`` ask for, in memory or streamed."""
    import torch

    from ..convert import calibration_runner
    from ..pipelines import load_pipeline, local_folder
    from ..streaming import tune_pretrained
    from ..tuning import tune_model

    folder = local_folder(args.model) if args.streamed else None  # a hub id refused before anything loads
    pipe = load_pipeline(args.model, progress_bar=False, **({"transformer": None} if args.streamed else {}))
    calib = calibration(args, pipe)
    if isinstance(calib, str):
        raise ValueError("--calib for tuning must be a prompt file: tuning compares generated videos with full precision")
    calib = calib[: args.prompts]
    print(f"tuning {args.model} on {len(calib)} calibration prompts: " + (
        "stage 1 runs them once per layer and format" if args.sensitivity == "generation" else
        "stage 1 prices each layer and format on block inputs kept from one run, checked with a few runs") + (
        "; the transformer streamed from its files, one block in memory" if args.streamed else ""))
    search = dict(**target, seed=args.seed, time_budget_s=args.time_budget, base=args.base,
                  **({} if formats is None else {"formats": formats}), population=args.population,
                  generations=args.generations)
    if not args.streamed:
        return tune_model(pipe, calib, **search, calibration_kwargs=call_kwargs(args), sensitivity=args.sensitivity)
    if args.sensitivity != "blocks":
        raise ValueError("--streamed prices on kept block inputs: it takes --sensitivity blocks (the default) only")
    run, _ = calibration_runner(calib, pipe, call_kwargs(args))

    def generate(transformer):
        pipe.register_modules(transformer=transformer)
        return run()

    return tune_pretrained(folder, generate, **search, torch_dtype=torch.float32)


def _cmd_tune(args: argparse.Namespace) -> int:
    from ..files.atomic import write_text_atomic
    from ..eval.plots import plot_tuned_formats

    if Path(args.output).suffix != ".json":
        raise ValueError(f"-o {args.output!r}: the tuned config is written as a .json file")
    check_output_file(args.output)
    if args.plot:
        check_output_file(args.plot, "--plot")
    target = dict(max_bits=args.max_bits, min_psnr=args.min_psnr,
                  max_bytes=None if args.max_mib is None else int(args.max_mib * 2**20))
    formats = None if args.formats is None else [None if f in ("16-bit", "fp") else f for f in args.formats.split(",")]
    report = _tuned(args, target, formats)
    write_text_atomic(args.output, json.dumps(report.config.to_dict(), indent=1) + "\n")
    print(report.summary())
    if args.plot:
        plot_tuned_formats(report, args.plot)
        print(f"wrote {args.plot}")
    print(f"wrote {args.output}: sixbit convert --model {args.model} --config {args.output} -o model.safetensors")
    if not report.reached:
        print(f"sixbit: --min-psnr {args.min_psnr:g} dB was NOT reached (the best assignment found reaches "
              f"{report.best['psnr_bound']:.2f} dB, mean − 1 SE); {args.output} holds it all the same, marked "
              f"\"(NOT reached)\"; exit code {NOT_REACHED}", file=sys.stderr)
        return NOT_REACHED
    return 0


def register(sub) -> None:
    """Add ``tune`` to the ``sixbit`` sub-command parser."""
    p = sub.add_parser(
        "tune", help="find per-layer weight formats for a bit, size or PSNR target; write a config",
        description="Price what each attention and feed-forward linear costs the calibration videos in each "
        "candidate format, then search per-layer formats (greedy, then a genetic search) for one target; the pick "
        "is checked on whole calibration runs. Writes a ConvertConfig JSON for `sixbit convert --config`.", epilog=_EPILOG)
    p.add_argument("--model", required=True, help="shapes-cogvideox, shapes-wan, a save_pretrained folder or a Hub id")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--max-bits", type=float_in(1.0, 32.0), help="best PSNR at ≤ this many average bits per weight")
    target.add_argument("--min-psnr", type=float_in(1.0, 99.0), help="fewest bits whose calibration videos' mean PSNR minus one "
                        f"standard error reaches this (dB): a margin for other prompts. Not reached: the best config "
                        f"found is written, exit code {NOT_REACHED}")
    target.add_argument("--max-mib", type=float_in(0.001, 1e7), help="best PSNR whose transformer fits in this many MiB")
    p.add_argument("--calib", help="a text file with one prompt per line (default for the shapes models: 8 of theirs)")
    p.add_argument("--prompts", type=int_in(1, 10_000), default=4, help="use the first N calibration prompts (default 4)")
    p.add_argument("--steps", type=steps_type, help="sampling steps of the calibration runs (default: the pipeline's)")
    p.add_argument("--base", default="w4a8", help="preset or .json whose weight recipe and activations are tuned (default w4a8)")
    p.add_argument("--formats", help="comma-separated candidate formats, 16-bit for full precision "
                   "(default int3-g64,nvfp4,int6,int8,16-bit)")
    p.add_argument("--sensitivity", choices=SENSITIVITY_MODES, default="blocks",
                   help="how stage 1 prices a layer in a format: blocks (default) its block's output error on block "
                   "inputs kept from one calibration run, mapped to video error by a few whole runs, the pick checked "
                   "with whole runs; generation: a whole calibration run per layer and format (exact, ~5x slower on the "
                   "shipped models)")
    p.add_argument("--streamed", action="store_true",
                   help="read the transformer from the model's folder one block at a time, for models larger than "
                   "memory (the candidates stay in memory: ~1.4x the blocks' bf16 size with the default formats); "
                   "the pick is measured with GPTQ on the full-precision model's inputs")
    p.add_argument("--seed", type=seed_type, default=0, help="the search's seed (default 0)")
    p.add_argument("--time-budget", type=float_in(1.0, 1e7), help="stop the search after about this many seconds")
    p.add_argument("--population", type=int_in(MIN_POPULATION, MAX_POPULATION), default=12,
                   help="assignments per generation (default 12)")
    p.add_argument("--generations", type=int_in(1, MAX_GENERATIONS), default=8, help="generations (default 8)")
    p.add_argument("--plot", help="also write the layer × format map as a PNG")
    p.add_argument("-o", "--output", required=True, help="the .json config to write")
    p.set_defaults(func=_cmd_tune)
