"""Public configuration dataclasses, validated on construction.

Every problem in a config is reported at once, in one ``ValueError``, before anything changes.
JSON is a plain serialization of these dataclasses (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any

from . import formats
from .nn.quant_linear import ActMode
from .transforms.hadamard import BLOCK_SIZES


class Role(str, enum.Enum):
    """What a linear layer does in a video DiT; quantization formats are chosen per role."""

    ATTENTION = "attention"  # q/k/v/out projections, including joint-attention context ones
    FEEDFORWARD = "feedforward"  # MLP up/down projections
    MODULATION = "modulation"  # adaLN / norm projections from the timestep embedding
    EMBEDDING = "embedding"  # patch / timestep / text / caption embedders, token refiners
    OUTPUT = "output"  # final norm modulation and projection to the latent space
    OTHER = "other"  # anything the model metadata does not classify


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
class QuantConfig:
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
        hadamard_block: block size of the online Hadamard rotation (16…256, a power of two) or
            ``None`` (default). A layer whose input size it does not divide gets the largest
            smaller block that does (at least 16), else no rotation.
        act_mode: initial activation precision of every quantized layer: ``"fp"`` (weight-only,
            default), ``"int8"`` or ``"nvfp4"`` (emulated).

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
    hadamard_block: int | None = None
    act_mode: str = "fp"

    def __post_init__(self):
        problems = []
        valid_roles = [r.value for r in Role]
        names = [("weight_format", self.weight_format)] + [
            (f"role_formats[{r!r}]", f) for r, f in self.role_formats.items() if f is not None
        ]
        if self.boundary_format is not None:
            names.append(("boundary_format", self.boundary_format))
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
        if problems:
            raise ValueError("invalid QuantConfig:\n  - " + "\n  - ".join(problems))

    def format_for(self, role: Role | str) -> str | None:
        """The weight format for layers of ``role`` (``None``: full precision)."""
        role = Role(role)
        if role.value in self.role_formats:
            return self.role_formats[role.value]
        return self.weight_format if role in DEFAULT_QUANTIZED_ROLES else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "QuantConfig":
        """Build from a JSON-like dict; unknown keys are reported with the other problems."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        try:
            cfg = cls(**{k: v for k, v in data.items() if k in fields})
        except ValueError as e:
            if unknown:
                raise ValueError(f"{e}\n  - unknown keys {unknown} (valid: {sorted(fields)})") from None
            raise
        if unknown:
            raise ValueError(f"invalid QuantConfig:\n  - unknown keys {unknown} (valid: {sorted(fields)})")
        return cfg
