"""The candidates of a tuning run: every tuned linear built once in every candidate format.

A :class:`Library` holds, per tuned layer, one module per candidate format (the original
``nn.Linear`` for full precision), built once with the base config's weight recipe (Hadamard
rotation, scale search, GPTQ, low-rank branch), and the base config's other quantized layers
(the 4-bit presets' modulation linears: *fixed*), built once in their formats. An assignment
(one format index per tuned layer, a *genome*) is applied by swapping its modules and the fixed
ones into the model — no re-quantization — and :meth:`Library.restore` puts every original
back. That makes one evaluation cost one set of generations.

Every layer is built from the full-precision model's inputs (GPTQ's Hessians, the scale
search's weights), as ``convert_model`` builds them with ``calibration_inputs=
"full_precision"`` — what a tuned config asks for — so an assignment converts to exactly the
layers measured here. Full precision is counted at 16 bits per weight (what it costs in the
bf16 model users run, whatever dtype the model is tuned in).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from torch import nn

from .. import formats
from ..builder import format_fits, plan_layers, quantized_linear, stored_bits
from ..calibration import hessians
from ..models import Role, block_index_of, iter_blocks, swap_layers
from ..nn.pointwise_conv import features, is_quantizable
from ..presets import ConvertConfig

#: The formats searched by default: INT3 with a scale per 64 weights (3.5 bits + the base recipe's
#: low-rank branch), NVFP4 (4.5 + branch), INT6 and INT8 per channel, and full precision (``None``,
#: counted at 16 bits). INT4 g64 and FP8 E4M3 are left out: at the same bits NVFP4 and INT8 beat
#: them on both shipped models (held-out PSNR, BENCHMARKS.md ``tune``), and each format costs a
#: calibration run per layer in stage 1.
DEFAULT_FORMATS: tuple[str | None, ...] = ("int3-g64", "nvfp4", "int6", "int8", None)
FULL_PRECISION_BITS = 16.0
TUNED_ROLES = (Role.ATTENTION.value, Role.FEEDFORWARD.value)


@dataclasses.dataclass
class Variant:
    """One layer in one format: ``bits`` stored per weight (scales and low-rank branch included)."""

    format: str | None
    module: nn.Module
    bits: float

    @property
    def label(self) -> str:
        return "16-bit" if self.format is None else self.format


@dataclasses.dataclass
class Layer:
    """A tuned linear: its name, role, block, weight count and variants (sorted by bits)."""

    name: str
    role: str
    block: int | None
    numel: int
    variants: list[Variant]


class Library:
    """Every tuned layer of ``model`` in every candidate format (see the module docstring)."""

    def __init__(self, model: nn.Module, layers: list[Layer], other_bytes: int, fixed: dict[str, nn.Module] | None = None):
        self.model, self.layers, self.other_bytes, self.fixed = model, layers, other_bytes, dict(fixed or {})
        self.originals = {name: model.get_submodule(name) for name in [*(layer.name for layer in layers), *self.fixed]}
        self.total_numel = sum(layer.numel for layer in layers)

    def apply(self, genome: tuple[int, ...]) -> None:
        """Swap in variant ``genome[i]`` of layer ``i``, and the fixed layers."""
        swap_layers(self.model, {**self.fixed, **{layer.name: layer.variants[i].module
                                                  for layer, i in zip(self.layers, genome)}})

    def restore(self) -> None:
        """Put every original layer back."""
        swap_layers(self.model, self.originals)

    def bits(self, genome: tuple[int, ...]) -> float:
        """Average stored bits per weight over the tuned layers."""
        return sum(layer.numel * layer.variants[i].bits for layer, i in zip(self.layers, genome)) / self.total_numel

    def bytes(self, genome: tuple[int, ...]) -> int:
        """Transformer bytes under ``genome``: the tuned layers' weights at their stored bits, plus
        every other tensor as the model holds it after conversion."""
        return self.other_bytes + int(sum(layer.numel * layer.variants[i].bits / 8 for layer, i in zip(self.layers, genome)))

    def formats(self, genome: tuple[int, ...]) -> dict[str, str | None]:
        """``{layer name: format}`` of ``genome`` (``None``: full precision)."""
        return {layer.name: layer.variants[i].format for layer, i in zip(self.layers, genome)}

    def uniform(self, fmt: str | None) -> tuple[int, ...] | None:
        """The genome giving every layer ``fmt``, or ``None`` where a layer cannot take it."""
        genome = []
        for layer in self.layers:
            index = next((i for i, v in enumerate(layer.variants) if v.format == fmt), None)
            if index is None:
                return None
            genome.append(index)
        return tuple(genome)


def tuned_layers(model: nn.Module, config: ConvertConfig) -> dict[str, tuple[int | None, str]]:
    """``{name: (hadamard block, role)}`` of the layers a tuning run assigns formats to: the
    attention and feed-forward linears the base config quantizes (its other layers keep their
    formats)."""
    plan = plan_layers(model, config.weights)
    return {name: (hb, role) for name, (_, hb, role) in plan.items() if role in TUNED_ROLES}


def fixed_layers(model: nn.Module, config: ConvertConfig) -> dict[str, tuple[str, int | None, str]]:
    """``{name: (format, hadamard block, role)}`` of the layers the base config quantizes that a
    tuning run leaves in their formats (the 4-bit presets' modulation linears)."""
    return {name: entry for name, entry in plan_layers(model, config.weights).items() if entry[2] not in TUNED_ROLES}


@dataclasses.dataclass
class CandidatePlan:
    """What the candidates of a tuning run will cost, known from the layers' shapes before any is
    built (:func:`plan_candidates`): what a target is checked against before stage 1 runs.

    Attributes:
        bits: ``{tuned layer: {format: stored bits per weight}}`` of the candidates that fit it
            (``None``: full precision, 16 bits); the bits :func:`build_library` measures.
        in_features / numel: ``{tuned layer: in_features / weights}``.
        candidates: the formats asked for, ``None`` included.
        other_bytes: the transformer's bytes besides the tuned layers' weights (:class:`Library`).
    """

    bits: dict[str, dict[str | None, float]]
    in_features: dict[str, int]
    numel: dict[str, int]
    candidates: tuple[str | None, ...]
    other_bytes: int

    def fewest_bits(self) -> float:
        """Average bits per tuned weight with every layer in its smallest candidate."""
        return sum(self.numel[n] * min(b.values()) for n, b in self.bits.items()) / sum(self.numel.values())

    def fewest_bytes(self) -> int:
        """Transformer bytes with every tuned layer in its smallest candidate."""
        return self.other_bytes + int(sum(self.numel[n] * min(b.values()) / 8 for n, b in self.bits.items()))

    def unfit(self, fmt: str) -> list[str]:
        """The tuned layers ``fmt`` does not fit (its block does not divide their ``in_features``)."""
        return [name for name, bits in self.bits.items() if fmt not in bits]


def plan_candidates(model: nn.Module, config: ConvertConfig, candidates: tuple[str | None, ...]) -> CandidatePlan:
    """The :class:`CandidatePlan` of building ``model``'s tuned layers in ``candidates`` with
    ``config``'s weight recipe; nothing is built or run (a few bytes quantized per distinct shape)."""
    weights = dataclasses.replace(config.weights, act_mode=config.activations)
    tuned = tuned_layers(model, config)
    if not tuned:
        raise ValueError(f"{type(model).__name__}: the base config quantizes no attention or feed-forward linear to tune")
    bits, in_features, numel, known = {}, {}, {}, {}
    for name, (_, role) in tuned.items():
        linear = model.get_submodule(name)
        k, n = features(linear)  # a conv's: in channels × kernel taps
        bits[name] = {}
        for fmt in candidates:
            if fmt is None:
                bits[name][None] = FULL_PRECISION_BITS
            elif format_fits(fmt, k):
                key = (fmt, k, n, role)
                if key not in known:
                    known[key] = stored_bits(linear, fmt, weights, role)
                bits[name][fmt] = known[key]
        in_features[name], numel[name] = k, k * n
    other = _converted_bytes(model, config) - 2 * sum(numel.values())  # the tuned layers counted at 16 bits
    return CandidatePlan(bits, in_features, numel, tuple(candidates), other)


def input_stats(model: nn.Module, run: Callable[[], object], names: list[str]) -> dict[str, hessians.InputStats]:
    """Input Hessians of ``names`` on the full-precision model, one calibration run per block
    (one block's ``K × K`` sums held at a time)."""
    blocks = {name: idx for idx, name, _, _ in iter_blocks(model)}
    groups: dict[int, list[str]] = {}
    for name in names:
        groups.setdefault(block_index_of(name, blocks) or 0, []).append(name)
    stats = {}
    for idx in sorted(groups):
        stats.update(hessians.collect(model, run, {n: model.get_submodule(n) for n in groups[idx]}))
    return stats


def build_library(model: nn.Module, config: ConvertConfig, candidates: tuple[str | None, ...],
                  stats: dict[str, hessians.InputStats], progress: bool = True,
                  unmeasured: Collection[str] = ()) -> Library:
    """Build every tuned layer of ``model`` in every format of ``candidates``, and the fixed
    layers (:func:`fixed_layers`) in theirs, with ``config``'s weight recipe (``stats`` feed GPTQ
    and smoothing when the recipe asks for them). A format a layer cannot take (its block does
    not divide the layer's input) is left out for that layer.

    ``unmeasured``: tuned layers the calibration run never calls, so no run can measure them;
    they join the fixed layers in the base config's format (what ``convert_model`` gives a layer
    the tuned config names no format for), rather than be searched."""
    from tqdm.auto import tqdm

    plan = plan_layers(model, config.weights)
    tuned = {name: entry for name, entry in tuned_layers(model, config).items() if name not in unmeasured}
    if not tuned:
        raise ValueError(f"{type(model).__name__}: the base config quantizes no attention or feed-forward linear to tune")
    blocks = {name: idx for idx, name, _, _ in iter_blocks(model)}
    layers = []
    bar = tqdm(total=len(tuned), desc="building candidates", disable=not progress, leave=False)
    for name, (hb, role) in tuned.items():
        layers.append(build_layer(model, config, name, hb, role, candidates, stats.get(name), blocks))
        bar.update()
    bar.close()
    kept = {**fixed_layers(model, config), **{name: plan[name] for name in unmeasured}}
    return assemble(model, config, layers, build_fixed(model, config, kept, stats))


def build_layer(model: nn.Module, config: ConvertConfig, name: str, hadamard_block: int | None, role: str,
                candidates: tuple[str | None, ...], stats: hessians.InputStats | None,
                blocks: dict[str, int]) -> Layer:
    """The tuned layer ``name`` in every format of ``candidates`` it fits (``None``: the layer
    itself), with ``config``'s weight recipe; ``blocks``: ``{block module name: index}``."""
    weights = dataclasses.replace(config.weights, act_mode=config.activations)
    linear = model.get_submodule(name)
    numel = features(linear)[0] * features(linear)[1]
    variants = []
    for fmt in candidates:
        if fmt is None:
            variants.append(Variant(None, linear, FULL_PRECISION_BITS))
        elif format_fits(fmt, features(linear)[0]):
            q = quantized_linear(linear, fmt, hadamard_block, weights, role,
                                 stats if weights.needs_calibration else None, name=name)
            variants.append(Variant(fmt, q, 8 * q.weight_nbytes() / numel))
    variants.sort(key=lambda v: v.bits)
    return Layer(name, role, block_index_of(name, blocks), numel, variants)


def build_fixed(model: nn.Module, config: ConvertConfig, kept: dict[str, tuple[str, int | None, str]],
                stats: dict[str, hessians.InputStats]) -> dict[str, nn.Module]:
    """``kept`` (``{name: (format, hadamard block, role)}``: layers left in one format) built."""
    weights = dataclasses.replace(config.weights, act_mode=config.activations)
    use_stats = weights.needs_calibration
    return {name: quantized_linear(model.get_submodule(name), fmt, hb, weights, role,
                                   stats.get(name) if use_stats else None, name=name)
            for name, (fmt, hb, role) in kept.items()}


def assemble(model: nn.Module, config: ConvertConfig, layers: list[Layer], fixed: dict[str, nn.Module]) -> Library:
    """The :class:`Library` of built ``layers`` and ``fixed`` ones (their bytes counted)."""
    numel = sum(layer.numel for layer in layers)
    other = _converted_bytes(model, config, {layer.name for layer in layers}) - 2 * numel  # tuned counted at 16 bits
    return Library(model, layers, other, fixed)


def unmeasured_layers(transformer, config: ConvertConfig, tuned: list[str], stats: Collection[str]) -> dict[str, str]:
    """``{layer: the base config's format}`` of the tuned layers the calibration run never called
    (``stats``: the layers it called, or their statistics; no run can measure the others: the
    search would find them free and give them its fewest bits);
    every one never called is refused (every assignment would score the same)."""
    never = [name for name in tuned if name not in stats]
    if len(never) == len(tuned):
        raise ValueError("the calibration run never called the tuned model's layers (does it generate with "
                         "another pipeline or model?): pass a callable that runs this model, e.g. "
                         "lambda: pipe(prompts, generator=torch.Generator().manual_seed(0))")
    plan = plan_layers(transformer, config.weights)
    return {name: plan[name][0] for name in never}


def unmeasured_note(unmeasured: dict[str, str], tuned: int) -> str:
    names = list(unmeasured)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    kept = ", ".join(sorted(set(unmeasured.values())))
    return (f"{len(names)} of the {tuned} tuned layers never ran on the calibration run ({shown}): they keep the "
            f"base config's format ({kept}), unmeasured, and the PSNR reported does not cover them; to tune them, "
            f"calibrate with prompts or inputs that run them")


def _converted_bytes(model: nn.Module, config: ConvertConfig, tuned: set[str] | None = None) -> int:
    """Bytes of ``model`` converted by ``config`` with the ``tuned`` layers (default: every one
    :func:`tuned_layers` names) at 16 bits: the other quantized linears at their formats' bits per
    element (scales per channel left out), every other tensor at 2 bytes per floating-point
    element (the bf16 model)."""
    plan = plan_layers(model, config.weights)
    tuned = set(tuned_layers(model, config)) if tuned is None else tuned
    total = 0
    for name, module in model.named_modules():
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if is_quantizable(module) and name in plan and name not in tuned:
            fmt = formats.get(plan[name][0])
            total += int(module.weight.numel() * fmt.bits_per_element / 8)
            own = [t for t in own if t is not module.weight]
        elif is_quantizable(module) and name in tuned:
            total += 2 * module.weight.numel()
            own = [t for t in own if t is not module.weight]
        total += sum(t.numel() * (2 if t.is_floating_point() else t.element_size()) for t in own)
    return total


__all__ = ["DEFAULT_FORMATS", "CandidatePlan", "Layer", "Library", "Variant", "assemble", "build_fixed", "build_layer",
           "build_library", "fixed_layers", "input_stats", "plan_candidates", "tuned_layers", "unmeasured_layers",
           "unmeasured_note"]
