"""Argument types and checks shared by every ``sixbit`` command: numbers in range, output paths
that can be written, calibration data from flags. Each refuses bad input at parse time or before
anything loads, with one line that names the flag."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..eval.media import check_writable, video_path
from ..pipelines import shapes_arch
from ..zoo.shapes import all_prompts

DEFAULT_SEED = 0
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds; eval adds the prompt index
MAX_STEPS = 10_000
MAX_SCALE = 32  # a 32-px video becomes 1024 px
MAX_GUIDANCE = 1000.0


def _shown(text: str) -> str:
    return repr(text if len(text) <= 24 else text[:21] + "...")


def int_in(low: int, high: int, note: str = "", multiple_of: int = 1):
    """An argparse ``type=``: a whole number in ``low..high`` (argparse names the flag in its error).

    A bad value ends the command at parse time, before anything loads:
    ``sixbit: error: argument --steps: must be a whole number from 1 to 10000, got '0'; see `sixbit generate --help```.
    """
    span = f"a whole number from {low} to {high}" + (f", a multiple of {multiple_of}" if multiple_of > 1 else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {span}{note}, got {_shown(text)}") from None
        if not low <= value <= high or value % multiple_of:
            raise argparse.ArgumentTypeError(f"must be {span}{note}, got {_shown(text)}")
        return value

    parse.__name__ = "int"
    return parse


def float_in(low: float, high: float, note: str = ""):
    """An argparse ``type=``: a finite number in ``[low, high]`` (no nan, no inf)."""
    span = f"a number from {low:g} to {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {span}{note}, got {_shown(text)}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"must be {span}{note}, got {_shown(text)}")
        return value

    parse.__name__ = "float"
    return parse


steps_type = int_in(1, MAX_STEPS)
seed_type = int_in(0, MAX_SEED)
guidance_type = float_in(0.0, MAX_GUIDANCE, " (≤ 1: no classifier-free guidance)")


def check_output_file(path: str, flag: str = "-o", video: bool = False) -> None:
    """Refuse, before the pipeline loads, an output file that cannot be written; nothing is created.

    With ``video``, the file :func:`~sixbit.eval.media.write_video` writes for ``path`` (its
    suffix replaced) is checked too. The error names ``flag``:
    ``-o 'out.mp4': it is a folder; give a file path such as 'out.mp4/out.mp4'``.
    """
    try:
        check_writable(path, create=False)
        if video:
            check_writable(video_path(path), create=False)
    except ValueError as e:
        cause = str(e).removeprefix(f"cannot write {str(Path(path))!r}: ")  # the path is named once
        raise ValueError(f"{flag} {path!r}: {cause}") from None


def check_output_folder(path: str, flag: str = "-o") -> None:
    """Refuse, before any work, an output folder that is a file or cannot be made; nothing is created."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag} {path!r} is a file, not a folder: give a folder path (it is created if missing)")
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))  # made if missing
    if not existing.is_dir():
        raise ValueError(f"{flag} {path!r}: {str(existing)!r} is a file, not a folder; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path!r}: the folder {str(existing)!r} is not writable; choose a folder you can write to")


def read_prompts(path: str) -> list[str]:
    """The prompts of a text file, one per line (blank lines and ``#`` comments skipped)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"prompt file {path!r} does not exist")
    prompts = [line.strip() for line in file.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if not prompts:
        raise ValueError(f"prompt file {path!r} holds no prompts (one per line)")
    return prompts


def calibration(args, pipe):
    """Prompts from a text file, a folder of videos, or the shipped model's own prompts."""
    if args.calib is None:
        if shapes_arch(pipe) is None:
            raise ValueError("--calib is required for this model: a text file with one prompt per line, or a folder of videos")
        return all_prompts()[::6]  # 8 prompts covering every color, shape and direction
    return args.calib if Path(args.calib).is_dir() else read_prompts(args.calib)


def call_kwargs(args) -> dict:
    """The pipeline-call keywords that --steps and --guidance set."""
    kw = {}
    if getattr(args, "steps", None) is not None:
        kw["num_inference_steps"] = args.steps
    if getattr(args, "guidance", None) is not None:
        kw["guidance_scale"] = args.guidance
    return kw
