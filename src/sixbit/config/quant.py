"""How :func:`sixbit.quantize` replaces a model's linear layers: :class:`QuantConfig`."""

from __future__ import annotations

import dataclasses
import re

from .. import formats
from ..models.roles import Role
from ..nn.precision import ActMode
from ..transforms.hadamard import BLOCK_SIZES
from .validate import report, type_problems
from .serialize import Serializable

SCALE_RULES = ("absmax", "mse", "4/6")  # how a block scale is chosen (sixbit.rounding.grid)


#: Where calibration takes each block's inputs from (``QuantConfig.calibration_inputs``).
CALIBRATION_INPUTS = ("quantized", "full_precision")

# Roles quantized by default: the bulk of a DiT's weights and FLOPs. Modulation, embedding
# and output layers are small, sensitive (they scale every token) and stay in full precision.
DEFAULT_QUANTIZED_ROLES = (Role.ATTENTION, Role.FEEDFORWARD)


def pattern_problems(field: str, patterns) -> list[str]:
    """One message per entry of ``patterns`` that is not a valid regular expression."""
    problems = []
    for pattern in patterns:
        try:
            re.compile(pattern)
        except (re.error, TypeError) as e:
            problems.append(f"{field} pattern {pattern!r} is not a valid regular expression: {e}")
    return problems


@dataclasses.dataclass
class QuantConfig(Serializable):
    """How :func:`sixbit.quantize` replaces a model's linear layers.

    Args:
        weight_format: format of attention and feed-forward weights (default ``"nvfp4"``, 4.5
            bits; ``"int8"`` is nearly lossless at 8 bits). Any name in
            ``sixbit.formats.available()``.
        role_formats: per-role overrides, e.g. ``{"feedforward": "int6", "modulation": "int8"}``;
            ``None`` keeps a role in full precision. Roles: attention, feedforward, modulation,
            embedding, output, other. Unlisted roles: attention/feedforward use
            ``weight_format``, the others stay in full precision.
        include: ``re.fullmatch`` patterns on module names (``"transformer_blocks.0.attn1.to_q"``);
            when given, only matching layers are quantized.
        exclude: ``re.fullmatch`` patterns of layers never quantized (applied after ``include``).
        boundary_blocks: the first and the last N transformer blocks use ``boundary_format``
            instead (they are the most sensitive). Default 0.
        boundary_format: format for those blocks' quantized layers (default ``"int8"``;
            ``None`` keeps them in full precision).
        layer_formats: per-layer formats by exact module name, e.g.
            ``{"transformer_blocks.0.attn1.to_q": "int8", "transformer_blocks.3.ff.net.2": None}``
            (``None``: full precision). They win over ``role_formats`` and the boundary blocks;
            a name the model lacks, or one ``include``/``exclude`` leaves out, is an error at
            quantization. :func:`sixbit.tune` writes this map.
        hadamard_block: block size of the online Hadamard rotation (16…256, a power of two) or
            ``None`` (default). A layer whose input size it does not divide gets the largest
            smaller block that does (at least 16), else no rotation.
        act_mode: initial activation precision of every quantized layer: ``"fp"`` (weight-only,
            default), ``"int8"`` or ``"nvfp4"`` (emulated).
        weight_only_roles: roles whose quantized layers always multiply in full precision
            (their low-bit weight saves memory, not compute), whatever ``act_mode`` or a runtime
            method says. Default: modulation, embedding, output (small GEMMs on few rows that
            scale or produce every token).
        scale_rule: how block scales are chosen (NVFP4 and symmetric integer formats; others
            round to nearest): ``"absmax"`` (round to nearest, default), ``"mse"`` (searched per
            block for the least squared error: free at run time, ~1.4 dB weight SQNR on NVFP4;
            weighted by the calibration Hessian's diagonal when calibration runs) or ``"4/6"``
            (NVFP4: ``amax/6`` or ``amax/4`` per block). See :mod:`sixbit.rounding.grid`.
        gptq: round with GPTQ (:mod:`sixbit.rounding.gptq`; NVFP4 and symmetric integer formats,
            others round to nearest) on input Hessians recorded from
            calibration generations, one transformer block at a time (each block's inputs come
            from the already quantized blocks before it, unless ``calibration_inputs`` says
            otherwise). Needs calibration data; costs one calibration run at conversion (each
            block replays the first block's kept inputs: :mod:`sixbit.builder.block_inputs`),
            nothing at run time. Default ``False``.
        calibration_inputs: where the calibrated steps (GPTQ, the Hessian-weighted scale search,
            smoothing, refinement) take each block's inputs from: ``"quantized"`` (default: the
            model whose blocks before it are already quantized) or ``"full_precision"`` (the
            unchanged model: every layer is built from the same inputs whatever the others'
            formats, so a layer's quantized weights do not depend on them: what
            :func:`sixbit.tune` measures). Neither wins on every model: the shipped models'
            calibration PSNR moved by up to ±1.5 dB between the two, either way (``tune`` writes
            the better one for its pick).
        gptq_damp: GPTQ's diagonal damping, a fraction of the Hessian's mean diagonal (default
            0.01; raised 10× per retry when the factorization fails).
        lowrank_rank: rank ``r`` of a 16-bit low-rank branch (SVDQuant) beside each 4-bit
            weight of a compute layer (not the ``weight_only_roles``; 0: none, default). Costs
            ``16·r·(K+N)/(K·N)`` bits per weight (≈ 0.017·r at width 1920, 0.17·r at 192) and a
            small extra GEMM per call.
        lowrank_bits: instead of a fixed rank, each layer's rank is the largest whose branch
            costs at most this many bits per weight (0.5 → r = 30 at 1920×1920, r = 3 at
            192×192). Default 0 (off); exclusive with ``lowrank_rank``.
        lowrank_max_rank: with ``lowrank_bits``, the largest rank any layer gets (0: no cap,
            default). The bits rule alone grows the rank with the width (r = 80 at 5120); a cap
            keeps the branch's share of the bytes shrinking on big models instead.
        lowrank_iterations: alternating refinements of the branch against the quantized
            residual (default 2).
        refine_steps: Adam iterations per block fitting the low-rank branches to the
            full-precision block's outputs on the calibration inputs (:mod:`sixbit.rounding.refine`;
            needs a branch and calibration; 0: off, default). Only the branches change; a block
            keeps them only if its output error drops.
        refine_calls: recorded calls per block the refinement fits on (default 32, a seeded
            random sample of every step and CFG branch).
        smooth_alpha: ``None`` (default) or α in (0, 1): before the low-rank split, smooth each
            branched layer as SVDQuant does, ``s_j = max|x_j|^α / max|W_j|^(1−α)`` from the
            calibration inputs, folded into the stored weight and divided out of every input
            (``QuantLinear``'s ``input_divisor``). Needs calibration; a smoothed layer is not
            rotated (the Hadamard rotation would mix the smoothed channels).

    Example:
        >>> cfg = QuantConfig(weight_format="nvfp4", role_formats={"feedforward": "int8"}, boundary_blocks=1)
        >>> cfg.format_for("feedforward")
        'int8'
    """

    weight_format: str = "nvfp4"
    role_formats: dict[str, str | None] = dataclasses.field(default_factory=dict)
    include: list[str] = dataclasses.field(default_factory=list)
    exclude: list[str] = dataclasses.field(default_factory=list)
    boundary_blocks: int = 0
    boundary_format: str | None = "int8"
    layer_formats: dict[str, str | None] = dataclasses.field(default_factory=dict)
    hadamard_block: int | None = None
    act_mode: str = "fp"
    weight_only_roles: list[str] = dataclasses.field(
        default_factory=lambda: [Role.MODULATION.value, Role.EMBEDDING.value, Role.OUTPUT.value])
    scale_rule: str = "absmax"
    gptq: bool = False
    gptq_damp: float = 0.01
    calibration_inputs: str = "quantized"
    lowrank_rank: int = 0
    lowrank_bits: float = 0.0
    lowrank_max_rank: int = 0
    lowrank_iterations: int = 2
    refine_steps: int = 0
    refine_calls: int = 32
    smooth_alpha: float | None = None

    def __post_init__(self):
        problems = type_problems(self)
        valid_roles = [r.value for r in Role]
        names = [("weight_format", self.weight_format)] + [
            (f"role_formats[{r!r}]", f) for r, f in self.role_formats.items() if f is not None
        ]
        if self.boundary_format is not None:
            names.append(("boundary_format", self.boundary_format))
        names += [(f"layer_formats[{n!r}]", f) for n, f in self.layer_formats.items() if f is not None]
        for field, name in names:
            if name not in formats.available():
                problems.append(f"{field}={name!r} is not a format (see `sixbit formats`)")
        problems += [
            f"role_formats has unknown role {r!r} (valid: {valid_roles})"
            for r in self.role_formats if r not in valid_roles
        ]
        problems += pattern_problems("include", self.include) + pattern_problems("exclude", self.exclude)
        if not isinstance(self.boundary_blocks, int) or self.boundary_blocks < 0:
            problems.append(f"boundary_blocks must be an integer ≥ 0, got {self.boundary_blocks!r}")
        if self.hadamard_block is not None and self.hadamard_block not in BLOCK_SIZES:
            problems.append(f"hadamard_block must be None or one of {BLOCK_SIZES}, got {self.hadamard_block!r}")
        if self.act_mode not in [m.value for m in ActMode]:
            problems.append(f"act_mode={self.act_mode!r} is not one of {[m.value for m in ActMode]}")
        problems += [f"weight_only_roles has unknown role {r!r} (valid: {valid_roles})"
                     for r in self.weight_only_roles if r not in valid_roles]
        if self.scale_rule not in SCALE_RULES:
            problems.append(f"scale_rule={self.scale_rule!r} is not one of {list(SCALE_RULES)}")
        if not isinstance(self.gptq, bool):
            problems.append(f"gptq must be true or false, got {self.gptq!r}")
        if isinstance(self.gptq_damp, bool) or not isinstance(self.gptq_damp, (int, float)) or not 0 < self.gptq_damp < 1:
            problems.append(f"gptq_damp must be a number in (0, 1), got {self.gptq_damp!r}")
        if self.calibration_inputs not in CALIBRATION_INPUTS:
            problems.append(f"calibration_inputs={self.calibration_inputs!r} is not one of {list(CALIBRATION_INPUTS)}")
        for field in ("lowrank_rank", "lowrank_max_rank", "lowrank_iterations"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{field} must be an integer ≥ 0, got {value!r}")
        if isinstance(self.lowrank_bits, bool) or not isinstance(self.lowrank_bits, (int, float)) or not self.lowrank_bits >= 0:
            problems.append(f"lowrank_bits must be a number ≥ 0, got {self.lowrank_bits!r}")
        elif self.lowrank_bits and self.lowrank_rank:
            problems.append("set lowrank_rank or lowrank_bits, not both")
        elif self.lowrank_max_rank and not self.lowrank_bits:
            problems.append("lowrank_max_rank caps the rank lowrank_bits chooses: set lowrank_bits too (or drop it)")
        if isinstance(self.refine_steps, int) and self.refine_steps < 0:
            problems.append(f"refine_steps must be an integer ≥ 0, got {self.refine_steps!r}")
        elif self.refine_steps and not (self.lowrank_rank or self.lowrank_bits):
            problems.append("refine_steps refines the low-rank branches: set lowrank_rank or lowrank_bits too")
        if isinstance(self.refine_calls, int) and self.refine_calls < 1:
            problems.append(f"refine_calls must be an integer ≥ 1, got {self.refine_calls!r}")
        if self.smooth_alpha is not None and (isinstance(self.smooth_alpha, bool) or not isinstance(
                self.smooth_alpha, (int, float)) or not 0 < self.smooth_alpha < 1):
            problems.append(f"smooth_alpha must be None or a number in (0, 1), got {self.smooth_alpha!r}")
        elif self.smooth_alpha is not None and not (self.lowrank_rank or self.lowrank_bits):
            problems.append("smooth_alpha smooths layers before their low-rank split: set lowrank_rank or lowrank_bits")
        if problems:
            raise ValueError(report("invalid QuantConfig", problems))

    @property
    def needs_calibration(self) -> bool:
        """Whether quantizing with this config runs calibration generations (GPTQ's Hessians,
        smoothing's activation ranges, refinement's block inputs)."""
        return self.gptq or self.smooth_alpha is not None or self.refine_steps > 0

    def lowrank_rank_for(self, in_features: int, out_features: int) -> int:
        """The branch rank of an ``in_features → out_features`` 4-bit layer (0: no branch)."""
        k, n = in_features, out_features
        rank = self.lowrank_rank or int(self.lowrank_bits * k * n // (16 * (k + n)))
        if self.lowrank_bits and self.lowrank_max_rank:
            rank = min(rank, self.lowrank_max_rank)
        return rank if rank <= min(k, n) // 2 else 0  # a branch as wide as the layer is no longer low-rank

    def format_for(self, role: Role | str) -> str | None:
        """The weight format for layers of ``role`` (``None``: full precision)."""
        role = Role(role)
        if role.value in self.role_formats:
            return self.role_formats[role.value]
        return self.weight_format if role in DEFAULT_QUANTIZED_ROLES else None
