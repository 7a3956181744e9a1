"""Real-size models from their files: conversion and tuning streamed block by block from a
diffusers model folder, and loading a checkpoint into a model that never holds full-precision weights.

:func:`convert_pretrained` builds the transformer on the meta device from its ``config.json``,
then, for the layers outside the blocks and for each block in turn, maps that part's tensors
from the safetensors shards, quantizes its linears (:func:`sixbit.builder.build`, the one build
path), writes the result to a part file and frees it: peak memory is one block in full precision
plus the quantizer's temporaries (a 28 GB Wan2.1-14B converts on a 24 GB machine). The parts are
then written as ``save_pretrained``'s folder or :func:`sixbit.save`'s file.

**Calibrated weights (GPTQ: ``"w4a8"``, ``"w4a4"``, ``"w4a16"``, ``"aggressive"``).** The
calibration generations run once on the full-precision model streamed from disk, keeping every
call's inputs to the first block. Then block by block: the block's input Hessians are recorded by
replaying the kept calls, its layers are quantized (GPTQ), and the *quantized* block's outputs
become the next block's kept inputs, as in the in-memory conversion (the same
:mod:`sixbit.builder.block_inputs`). With ``calibration_inputs="full_precision"`` the
full-precision block's outputs do, recorded by the replay that gives its Hessians: one replay
per block, and every block as the in-memory conversion builds it, to the bit. Kept inputs cost
``calls × tokens × width`` floats: calibrate with few, short generations.

**Methods fitted on the converted model (DMPQ: ``"w4a6-dynamic"``; ``"balanced"`` where the
device has FP4 GEMMs, :func:`sixbit.presets.for_device`).** Once every block is converted, the
parts are written into one file in the progress folder and loaded (mapped, as by
:func:`load_pretrained`: memory about the checkpoint's size), the methods are fitted on that model
as :func:`sixbit.convert_model` fits them, and it is written with their state. Static W8A8 and
the delta cache's ``min_psnr``, fitted on or against the full-precision model, do not stream.

**Tuning, streamed (:func:`tune_pretrained`).** :func:`sixbit.tuning.tune_model`'s
``sensitivity="blocks"`` on the transformer read from its files: the calibration streams as
above; each block is held while its Hessians are replayed, its candidates built and priced, and
its full-precision replay feeds the next (one block's Hessians at a time); the fit's and checks'
generations stream, the candidates swapped in. Every candidate stays in memory (about 1.4× the
blocks' bf16 bytes with the default formats). The pick is measured as its candidates were built
(``calibration_inputs="full_precision"``); otherwise the in-memory tuning's stage 1, fit and
pick, to the bit (``tests/test_pretrained_tune.py``).

**Resumable.** Each finished part (with its time, for GPTQ the next block's kept inputs) waits in
``<output>.sixbit-progress``: run again with the same arguments, a conversion goes on after its last
finished block, each verified (:mod:`sixbit.checkpoint.resume`), into the uninterrupted run's output.

:func:`load_pretrained` builds the model on the meta device and loads a checkpoint into it:
the packed weights map the file (read when used), and no full-precision copy of a quantized
layer is ever made, so peak memory is about the checkpoint's size.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from . import checkpoint
from .checkpoint import CheckpointWriter
from .builder import (OUTSIDE, BlockInputs, LayerSwap, Part, Recipe, ShardedModel, build, conversion_device, keeping,
                      parts_of, plan_layers, quantized_linear, release)
from .checkpoint.resume import Progress, conversion_arguments, progress_folder
from .calibration import hessians
from .convert import calibration_runner, fit_methods
from .methods.record import Conversion, conversion_state, install
from .methods.registry import methods
from .models import iter_blocks
from .integrations.diffusers.folder import checkpoint_writer
from .integrations.diffusers.reading import check_layout, empty_model, model_folder
from .files.safetensors import SafetensorsFolder, check_can_write
from .preflight import check_convertible, check_streamable
from .presets import for_device, resolve
from .rounding import refine
from .tuning import DEFAULT_FORMATS, Tuner, TuneReport
from .tuning.search import check_size
from .tuning.targets import check_seed, target

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class StreamedConversion:
    """What :func:`convert_pretrained` did.

    Attributes:
        path: the checkpoint written: the ``.safetensors`` file, or the diffusers folder (the
            pipeline folder for a pipeline).
        model_class: the transformer's class name.
        source_bytes: bytes of the source weights (the safetensors shards).
        checkpoint_bytes: bytes of the converted transformer written (the file, or the folder's
            weight files).
        seconds: wall time of the whole conversion.
        part_seconds: ``{part: seconds}``: ``"calibration runs"`` (GPTQ presets), ``"outside
            blocks"``, each block's module name (those converted by this call) and ``"fitting
            methods"`` (DMPQ presets).
        resumed_parts: parts an interrupted conversion had finished, verified, not converted again.
        resumed_seconds: ``{part: seconds}`` of those parts (and ``"calibration runs"`` where not
            run again), as the interrupted runs recorded them.
    """

    path: Path
    model_class: str
    source_bytes: int
    checkpoint_bytes: int
    seconds: float
    part_seconds: dict[str, float]
    resumed_parts: int = 0
    resumed_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


def _first_calls(streamed: ShardedModel, parts, calibration: Callable[[nn.Module], object]) -> BlockInputs:
    """Run the calibration on the full-precision model streamed from disk; keep the first block's inputs."""
    net = streamed.net
    handles = streamed.running_from_disk(parts)
    try:
        with keeping(net) as kept:
            if kept.problem is None:  # more than one block list is known before any generation
                calibration(net)
    finally:
        for h in handles:
            h.remove()
    if kept.problem is not None:
        raise ValueError(
            f"{kept.problem}: a streamed calibrated conversion replays each block on the previous block's outputs. "
            "Convert it in memory (sixbit.convert_model) or choose a calibration-free preset (e.g. 'w4a8-rtn', 'w8a8')"
        )
    return kept


class _StreamedParts(Recipe):
    """The streamed conversion's steps around the one build loop: each part mapped from the
    shards (its input statistics replayed from the kept calls), then refined, written to its
    part file (:class:`~sixbit.checkpoint.resume.Progress`) and freed: one block is resident at a time."""

    def __init__(self, streamed: ShardedModel, plan: dict, config, progress: Progress, parts: list[Part],
                 kept: BlockInputs | None, outside_stats: dict, bar):
        self.streamed, self.plan, self.weights, self.progress = streamed, plan, config.weights, progress
        self.in_blocks = {k for part in parts[1:] for k in part.keys}
        self.numbers = {part.name: i for i, part in enumerate(parts)}
        self.kept, self.outside_stats, self.bar = kept, outside_stats, bar
        self.last = parts[-1].name  # no block after it: its outputs feed nothing
        self.sequential = config.weights.calibration_inputs == "quantized"
        self.block_calls: list = []  # the block's kept inputs, for refinement
        self.seconds: dict[str, float] = {}
        self.started = 0.0

    def inputs(self, part: Part) -> dict[str, object]:
        self.started = time.perf_counter()
        if part.name == OUTSIDE:  # mapped before the calibration runs, which recorded its statistics
            return self.outside_stats
        self.streamed.load(part.keys)
        if self.kept is None:
            return {}
        net = self.streamed.net
        self.block_calls = list(self.kept.calls)
        # calibration_inputs="full_precision": this replay's outputs are the next block's inputs
        advance = not self.sequential and part.name != self.last
        return hessians.collect(part.module, lambda: self.kept.replay(part.module, advance=advance),
                                {name: net.get_submodule(name) for name in part.layers})

    def layer(self, name: str, original: nn.Module, stats) -> nn.Module:
        fmt, hb, role = self.plan[name]
        shards = self.streamed.shards
        file = shards.weight_map.get(f"{name}.weight")
        return quantized_linear(original, fmt, hb, self.weights, role, stats, name=name,
                                source=str(shards.folder / file) if file else None)

    def built(self, part: Part, layers: dict[str, nn.Module], swap: LayerSwap) -> None:
        net, model_class = self.streamed.net, type(self.streamed.net).__name__
        number = self.numbers[part.name]
        if part.name == OUTSIDE:  # the blocks are still on the meta device: everything else
            kept = (self.kept.index, self.kept.calls) if self.kept is not None else None
            seconds = self.progress.add_part(number, part.name, net, model_class,
                                             keys=set(net.state_dict()) - self.in_blocks, inputs=kept, started=self.started)
            swap.forget(part.layers)
        else:
            if self.kept is not None and self.weights.refine_steps:
                prefix = part.name + "."
                originals = {name[len(prefix):]: swap.original(name) for name in part.layers}
                calls = refine.sample_calls(self.block_calls, self.weights.refine_calls)
                result = refine.refine_block(part.name, part.module, originals, calls, self.weights.refine_steps)
                logger.info("%s: low-rank branches refined, output error %.3g -> %.3g (%s)", part.name,
                            result.error_before, result.error_after, "kept" if result.kept else "discarded")
            kept = None
            if self.kept is not None and part.name != self.last:
                if self.sequential:
                    self.kept.replay(part.module, advance=True)  # the quantized block's outputs feed the next one
                kept = (self.kept.index, self.kept.calls)  # saved with the block: a resume starts from them
            seconds = self.progress.add_part(number, part.name, part.module, model_class, f"{part.name}.", inputs=kept,
                                             started=self.started)
            swap.forget(part.layers)  # written: its full-precision layers are freed with the block
            release(part.module)
        self.seconds[part.name] = seconds
        self.bar.update()
        self.bar.set_postfix_str(f"{seconds:.1f} s/part")
        logger.info("%s: %.1f s", part.name, seconds)


def _resume(progress: Progress, parts: list[Part], config, streamed: ShardedModel, calibration,
            seconds: dict, start: float) -> tuple[BlockInputs | None, dict, list[Part]]:
    """``(kept calls, statistics of the layers outside the blocks, parts to convert)``, given the
    parts an interrupted run finished (verified here). Calibration-free: every part not done.
    Calibrated: each block's inputs come from the quantized block before it, so it goes on from
    the first part not done with the inputs saved for it; without them (or where they do not
    verify), the calibration generations run again and every block is converted again."""
    progress.start()
    done = progress.verified([part.name for part in parts])
    logger.info("%d of %d parts finished before, verified in %s", len(done), len(parts), progress.folder)
    streamed.load(parts[0].keys)  # the layers outside the blocks: the calibration runs and part 0 read them
    todo = [part for part in parts if part.name not in done]
    if not config.needs_calibration or not todo:
        return None, {}, todo
    first = parts.index(todo[0])
    saved = progress.kept_inputs(todo[0].index, streamed.device) if first > 0 else None
    if saved is not None:
        _, _, _, io = next(b for b in iter_blocks(streamed.net) if b[0] == todo[0].index)
        kept = BlockInputs(io, todo[0].index)
        kept.calls = saved
        return kept, {}, parts[first:]
    logger.info("calibration generations on the full-precision model, streamed from disk")
    net = streamed.net
    outside = {name: net.get_submodule(name) for name in parts[0].layers}
    runs: list[BlockInputs] = []
    outside_stats = hessians.collect(net, lambda: runs.append(_first_calls(streamed, parts, calibration)), outside)
    seconds["calibration runs"] = time.perf_counter() - start
    progress.calibrated(seconds["calibration runs"])
    return runs[0], outside_stats, parts[0 if OUTSIDE not in done else 1:]


def _fitted(chosen: dict) -> list[str]:
    """The chosen methods fitted on generations of the converted model (DMPQ)."""
    return [spec.name for spec in methods() if spec.name in chosen and spec.calibrates(chosen[spec.name])]


def _fit_converted(journal: Progress, parts: list[Part], folder: Path, config, chosen: dict, calibration: Callable,
                   device: torch.device, hardware: str | None, seconds: dict, progress: bool) -> nn.Module:
    """The converted model, loaded from its finished parts, with its methods fitted and installed
    (module doc); the time it took in ``seconds["fitting methods"]``."""
    start, weights, model = time.perf_counter(), journal.folder / "converted.safetensors", empty_model(folder)
    with CheckpointWriter(weights, type(model).__name__) as writer:
        journal.assemble(writer, [part.name for part in parts])
        writer.finish({})
    model = checkpoint.load(weights, model).to(device)
    run, described = calibration_runner(lambda: calibration(model), None, {})  # as convert_model runs a callable
    desc = f"fitting {', '.join(_fitted(chosen))} on the converted model"
    logger.info("%s", desc)
    with tqdm(desc=desc, unit="calibration run", disable=not progress) as bar:
        applied = fit_methods(model, chosen, lambda: (run(), bar.update())[0], described)
    install(model, config, applied, described, hardware)
    seconds["fitting methods"] = time.perf_counter() - start
    return model


def _check_output(output: str | os.PathLike) -> None:
    """Refuse an output where nothing can be written before any block is read (a file where a
    folder goes is the folder writer's to refuse)."""
    if Path(output).suffix == ".safetensors" or not Path(output).is_file():
        check_can_write(output if Path(output).suffix == ".safetensors" else Path(output) / "diffusion_pytorch_model.safetensors")


def convert_pretrained(model: str | os.PathLike, quant_config, output: str | os.PathLike,
                       calibration: Callable[[nn.Module], object] | None = None, *,
                       torch_dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                       progress: bool = True, max_shard_size: int | str = "10GB",
                       restart: bool = False) -> StreamedConversion:
    """Convert a diffusers transformer from its files, one block at a time, into a diffusers
    folder or a single-file checkpoint.

    Args:
        model: a diffusers model folder (``config.json`` + ``*.safetensors``, sharded or not) or a
            pipeline folder with ``transformer/``.
        quant_config: a preset name (``"w8a8"``, ``"w4a8-rtn"``, ``"w4a8"``, ``"w4a6-dynamic"``, ...;
            not static W8A8, see the module doc), a JSON file, a ``ConvertConfig`` or a
            ``QuantConfig`` (see :func:`sixbit.convert_model`).
        output: a folder: the diffusers folder a converted model's ``save_pretrained`` writes (a
            pipeline folder for a pipeline, its other components copied), which ``from_pretrained``
            restores once sixbit is imported; or a ``.safetensors`` file: :func:`sixbit.save`'s
            checkpoint. Files are written atomically (a folder's ``config.json`` last); an output where
            nothing can be written is refused before any block is read.
        calibration: for GPTQ and DMPQ presets, a callable ``calibration(transformer)`` that runs
            a few generations with the transformer it is given (e.g. your sampling loop, or
            ``lambda t: pipe(prompts, num_inference_steps=8)`` with ``pipe`` built around ``t``)
            and, for DMPQ, returns the videos (:func:`sixbit.convert_model`'s callable). The
            transformer computes in ``torch_dtype`` on ``device``: put the inputs on ``transformer.device``.
        torch_dtype: dtype the weights are loaded, and unquantized tensors written, in (default: as stored).
        device: where the conversion computes, each part read from the shards straight onto it
            (``"cuda"``, ``"cuda:1"``, ``"cpu"``; default: the current CUDA device where there is
            one, else the CPU; :func:`sixbit.builder.conversion_device`); the checkpoint is the
            same wherever it was made, to the device's rounding.
        progress: a progress bar over the parts (default ``True``).
        max_shard_size: bytes per weight file of a folder (``"10GB"``, ``"500MB"`` or an int;
            default ``"10GB"``), filled in the order the blocks are written.
        restart: start over, discarding an interrupted conversion into ``output`` (default ``False``:
            resume it; one with other arguments is refused). Its parts take the output's size on disk.

    Load a folder with ``from_pretrained`` (the model class's, or the pipeline's); a file with
    :func:`load_pretrained` (or :func:`sixbit.load` into any model of the same configuration).

    Example:
        >>> sixbit.convert_pretrained("Wan2.1-T2V-14B-Diffusers", "w8a8", "wan14b-w8a8")  # doctest: +SKIP
        >>> pipe = diffusers.WanPipeline.from_pretrained("wan14b-w8a8")  # doctest: +SKIP
        >>> sixbit.convert_pretrained("Wan2.1-T2V-14B-Diffusers", "w8a8", "wan14b-w8a8.safetensors")  # doctest: +SKIP
        >>> transformer = sixbit.load_pretrained("wan14b-w8a8.safetensors", "Wan2.1-T2V-14B-Diffusers")  # doctest: +SKIP
    """
    device = conversion_device(device)
    config, hardware = for_device(resolve(quant_config), device)
    check_streamable(config, quant_config, calibration)  # the config's own problems before any file is read
    folder = model_folder(model)
    net = empty_model(folder)
    chosen = check_convertible(config, net, empty=True)  # the one pre-flight check (sixbit.preflight), before any work
    _check_output(output)
    shards = SafetensorsFolder(folder)
    names = check_layout(folder, net, shards)
    plan = plan_layers(net, config.weights) if config.weights is not None else {}
    parts = parts_of(net, plan, names)
    arguments = conversion_arguments(folder, set(shards.weight_map.values()), config.to_dict(), calibration, output,
                                     max_shard_size, torch_dtype, device)
    journal = Progress(progress_folder(output), arguments, restart)  # refuses other arguments, changing nothing
    streamed = ShardedModel(shards, net, torch_dtype, device)
    start, seconds = time.perf_counter(), {}
    with checkpoint_writer(output, model, folder, net, max_shard_size) as writer:
        kept, outside_stats, todo = _resume(journal, parts, config, streamed, calibration, seconds, start)
        skipped = len(parts) - len(todo)
        earlier = journal.part_seconds(exclude={part.name for part in todo} | set(seconds))
        desc = f"converting {type(net).__name__}" + (f" ({skipped} parts verified, skipped)" if skipped else "")
        with tqdm(total=len(parts), initial=skipped, desc=desc, unit="part", disable=not progress) as bar:
            recipe = _StreamedParts(streamed, plan, config, journal, parts, kept, outside_stats, bar)
            build(net, todo, recipe)
        seconds.update(recipe.seconds)
        if _fitted(chosen):  # written as fitted, with the methods' state
            path = writer.write(_fit_converted(journal, parts, folder, config, chosen, calibration, device, hardware,
                                               seconds, progress))
        else:
            journal.assemble(writer, [part.name for part in parts])
            path = writer.finish({"conversion": conversion_state(Conversion(config, hardware=hardware))})
    journal.remove()
    total = time.perf_counter() - start
    logger.info("converted %s on %s in %.1f s into %s", type(net).__name__, device, total, path)
    written = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in model_folder(path).glob("*.safetensors"))
    return StreamedConversion(path, type(net).__name__, shards.nbytes(), written, total, seconds, skipped, earlier)


def tune_pretrained(model: str | os.PathLike, calibration: Callable[[nn.Module], object], *,
                    max_bits: float | None = None, min_psnr: float | None = None, max_bytes: int | None = None,
                    seed: int = 0, time_budget_s: float | None = None, base="w4a8", formats=DEFAULT_FORMATS,
                    population: int = 12, generations: int = 8, torch_dtype: torch.dtype | None = None,
                    device: str | torch.device | None = None, progress: bool = True) -> TuneReport:
    """Tune per-layer weight formats of a diffusers transformer streamed from its files, one block
    in memory (module doc); the :class:`~sixbit.tuning.TuneReport` (``.config``: the tuned config).

    Args:
        model: a diffusers model folder (``config.json`` + ``*.safetensors``) or a pipeline folder
            with ``transformer/``.
        calibration: ``calibration(transformer)`` runs a few generations with the transformer it
            is given and **returns the videos** (as :func:`sixbit.tune`'s callable does); every call
            must generate the same videos. Put its inputs on ``transformer.device``.
        torch_dtype, device: as :func:`convert_pretrained` takes them.
        Other arguments: as :func:`sixbit.tuning.tune_model` (``sensitivity`` is always ``"blocks"``).

    Example:
        >>> report = sixbit.tune_pretrained("Wan2.1-T2V-1.3B-Diffusers", my_loop, max_bits=5)  # doctest: +SKIP
        >>> sixbit.convert_pretrained("Wan2.1-T2V-1.3B-Diffusers", report.config, "wan-tuned", my_loop)  # doctest: +SKIP
    """
    constraint = target(max_bits, min_psnr, max_bytes, time_budget_s)  # bad arguments fail before any file is read
    check_size(population, generations)
    check_seed(seed)
    if not callable(calibration):
        raise ValueError(f"calibration must be a callable calibration(transformer) that runs generations with the "
                         f"transformer it is given and returns the videos, got {type(calibration).__name__}")
    folder = model_folder(model)
    net = empty_model(folder)
    shards = SafetensorsFolder(folder)
    parts = parts_of(net, [], check_layout(folder, net, shards))
    sharded = ShardedModel(shards, net, torch_dtype, conversion_device(device))
    sharded.load(parts[0].keys)  # the layers outside the blocks stay in memory
    held = {id(part.module): part for part in parts[1:]}
    handles = sharded.running_from_disk(parts)
    try:
        tuner = Tuner(net, lambda: calibration(net), base=base, formats=formats, progress=progress, target=constraint,
                      sensitivity="blocks", hold=lambda block: sharded.held(held[id(block)]))
        return tuner.search(max_bits=max_bits, min_psnr=min_psnr, max_bytes=max_bytes, seed=seed,
                            time_budget_s=time_budget_s, population=population, generations=generations)
    finally:
        for h in handles:
            h.remove()


def load_pretrained(checkpoint_path: str | os.PathLike, model: str | os.PathLike, *, layout: str | None = None) -> nn.Module:
    """A converted transformer: built on the meta device from ``model``'s ``config.json`` (a model
    or pipeline folder; its weights are not read) and loaded from ``checkpoint_path``, the packed
    weights mapped (read as they are used). Use it in a pipeline as diffusers allows:
    ``DiffusionPipeline.from_pretrained(folder, transformer=load_pretrained(ckpt, folder))``.
    ``layout``: as in :func:`sixbit.load`.

    Example:
        >>> transformer = sixbit.load_pretrained("wan14b-w8a8.safetensors", "Wan2.1-T2V-14B-Diffusers")  # doctest: +SKIP
    """
    return checkpoint.load(checkpoint_path, empty_model(model), layout=layout)
