"""``sixbit convert`` of a local model folder with a calibration-free preset: streamed block by
block from its safetensors shards (:func:`sixbit.convert_pretrained`), resumable (``--restart``
starts over instead)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def convert_streamed(args: argparse.Namespace, config, device: torch.device, output: Path):
    """Convert ``args.model`` into ``output``, printing what a person needs; returns the
    :class:`~sixbit.streaming.StreamedConversion`."""
    from ..checkpoint.resume import progress_folder
    from ..streaming import convert_pretrained

    print(f"streaming {args.model} block by block on {device} with {args.config!r}: {config.description}")
    if args.calib is not None:
        print(f"--calib is not used: {args.config!r} needs no calibration")
    print(f"finished blocks wait in {progress_folder(output)}: if it stops, run the same command again to resume "
          "(--restart starts over)")
    result = convert_pretrained(args.model, config, output, device=device, restart=args.restart)
    if result.resumed_parts:
        print(f"resumed an interrupted conversion: {result.resumed_parts} finished parts verified and skipped")
    slowest = max(result.part_seconds.values(), default=0.0)
    print(f"converted in {result.seconds:.1f} s ({slowest:.1f} s for the slowest part)")
    print(f"source weights {result.source_bytes / 2**20:.1f} MiB -> checkpoint {result.checkpoint_bytes / 2**20:.1f} MiB "
          f"({result.source_bytes / result.checkpoint_bytes:.2f}x)")
    print(f"wrote {result.path}")
    return result


def add_restart(parser: argparse.ArgumentParser) -> None:
    """``--restart``: start an interrupted streamed conversion over instead of resuming it."""
    parser.add_argument("--restart", action="store_true", help="a streamed conversion interrupted (Ctrl-C, a kill, a "
                        "full disk) resumes after its last finished block when run again with the same arguments (its "
                        "parts wait in OUTPUT.sixbit-progress); --restart discards them and starts over")
