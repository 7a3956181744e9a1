"""What :func:`sixbit.convert_model` does to a model: :class:`ConvertConfig` and the named presets.

A :class:`ConvertConfig` bundles the choices of a conversion — weight formats
(:class:`~sixbit.QuantConfig`), how activations are quantized (``"fp"``, ``"int8"``,
``"nvfp4"``, ``"dynamic"`` = DMPQ, ``"static"`` = static W8A8), the delta cache, and quantized
attention (off unless asked for), and nothing else. Presets are named configs; JSON is ``ConvertConfig.to_dict()``. :func:`resolve` turns a
preset name, a JSON file, a dict, a :class:`ConvertConfig` or a :class:`~sixbit.QuantConfig`
into a validated config, reporting every problem at once.

The seed's short JSON shape is accepted too and maps onto the ``"balanced"`` preset::

    {"attention": {"bits": 8, "symmetric": false},   # attention weights: int8-asym (per channel)
     "residual": {"bits": 4, "group_size": 64},      # cached block residuals: int4-g64
     "threshold": 0.01}                               # delta-cache skip threshold

``attention.bits`` (2…8) and ``symmetric`` (default true) choose the attention layers' weight
format ``int{bits}`` / ``int{bits}-asym``; ``residual`` chooses the delta cache's storage
(``bits`` 4 with ``group_size`` 64 → ``"int4-g64"``, ``bits`` 8 → ``"int8"``, ``bits`` 16 or 32
→ ``"fp"``); ``threshold`` is the delta cache's stability threshold. Any key may be left out.
Both shapes have an ``"attention"`` key: the short shape's holds ``bits``/``symmetric`` (weights),
the full schema's ``blocks``/``steps`` (quantized attention, :class:`~sixbit.AttentionQuantConfig`)
or ``null``; the other keys (or, alone, these) tell the shapes apart.

Example:
    >>> from sixbit.presets import resolve
    >>> resolve("balanced").activations
    'dynamic'
    >>> resolve({"attention": {"bits": 8, "symmetric": False}}).weights.role_formats["attention"]
    'int8-asym'
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from .validate import report, show, type_problems, unknown_keys
from .config import QuantConfig
from .kernels import fp4_supported
from .methods.attention import AttentionQuantConfig
from .methods.delta_cache import DeltaCacheConfig
from .methods.dmpq import DMPQConfig
from .methods.static_w8a8 import StaticW8A8Config

ACTIVATIONS = ("fp", "int8", "nvfp4", "dynamic", "static")


@dataclasses.dataclass
class ConvertConfig:
    """A whole conversion: weights, activations, cache, attention.

    Args:
        weights: how linears are quantized (:class:`~sixbit.QuantConfig`); ``None`` keeps the
            model in full precision (cache-only configs). Must be ``None`` with
            ``activations="static"``, whose ``static`` config quantizes the weights itself.
        activations: ``"fp"`` (weight-only), ``"int8"`` (per-token INT8, real integer GEMM),
            ``"nvfp4"`` (NVFP4 × NVFP4, emulated on this hardware), ``"dynamic"`` (DMPQ: NVFP4
            or INT8 per block and step, needs calibration) or ``"static"`` (static W8A8: every
            scale fixed offline per time range, needs calibration).
        dmpq: DMPQ settings (``activations="dynamic"``; default ``DMPQConfig()``).
        static: static W8A8 settings (``activations="static"``; default its ``"w8a8-static"`` preset).
        cache: delta-cache settings, or ``None`` for no cache.
        attention: where attention runs quantized (:class:`~sixbit.AttentionQuantConfig`: INT8
            Q·Kᵀ after smoothing K, FP16 P·V, per block and step), or ``None`` (default) for
            full-precision attention. Measured on the shipped models (BENCHMARKS.md,
            ``attention``): 50.7 dB (CogVideoX) / 44.2 dB (Wan) against full precision,
            adherence unchanged. Real speed on CUDA only (``sageattention``, else sixbit's
            Triton kernel); elsewhere it is emulated and *slower* than full precision
            (:func:`sixbit.kernels.available` says which), so no preset turns it on.
        description: one line shown by ``sixbit info`` and the preset table.

    Example:
        >>> from sixbit import AttentionQuantConfig
        >>> config = ConvertConfig(weights=QuantConfig(weight_format="int8"), activations="int8",
        ...                        attention=AttentionQuantConfig(steps=(2, None)))
        >>> ConvertConfig.from_dict(config.to_dict()) == config
        True
    """

    weights: QuantConfig | None = dataclasses.field(
        default_factory=lambda: QuantConfig(weight_format="nvfp4", hadamard_block=128)
    )
    activations: str = "dynamic"
    dmpq: DMPQConfig | None = None
    static: StaticW8A8Config | None = None
    cache: DeltaCacheConfig | None = None
    attention: AttentionQuantConfig | None = None
    description: str = ""

    def __post_init__(self):
        problems = type_problems(self)
        if self.activations not in ACTIVATIONS:
            problems.append(f"activations={self.activations!r} is not one of {list(ACTIVATIONS)}")
        if self.activations == "static":
            if self.weights is not None:
                problems.append('activations="static" quantizes the weights itself: set weights=None')
            if self.static is None:
                self.static = StaticW8A8Config.preset("w8a8-static")
        elif self.static is not None:
            problems.append(f'static is set but activations={self.activations!r} (use activations="static")')
        elif self.activations != "fp" and self.weights is None:
            problems.append(f"activations={self.activations!r} needs quantized weights: set weights=QuantConfig(...)")
        if self.weights is not None and self.weights.act_mode not in ("fp", self.activations):
            problems.append(f"weights.act_mode={self.weights.act_mode!r} contradicts activations={self.activations!r}: "
                            "set the precision in activations (weights.act_mode is for sixbit.quantize alone)")
        if self.activations == "dynamic":
            self.dmpq = self.dmpq or DMPQConfig()
        elif self.dmpq is not None:
            problems.append(f'dmpq is set but activations={self.activations!r} (use activations="dynamic")')
        if problems:
            raise ValueError(report("invalid ConvertConfig", problems))

    @property
    def needs_calibration(self) -> bool:
        """Whether converting with this config runs calibration generations (DMPQ, static W8A8, GPTQ)."""
        return self.activations in ("dynamic", "static") or (self.weights is not None and self.weights.needs_calibration)

    def calibration_reason(self) -> str | None:
        """What needs calibration, in words (``None`` when nothing does)."""
        if self.activations in ("dynamic", "static"):
            return f"activations={self.activations!r}"
        if self.weights is not None and self.weights.needs_calibration:
            w = self.weights
            return ("GPTQ weights (gptq=True)" if w.gptq else "smoothed weights (smooth_alpha)" if w.smooth_alpha is not None
                    else "refined low-rank branches (refine_steps)")
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights": None if self.weights is None else self.weights.to_dict(),
            "activations": self.activations,
            "dmpq": None if self.dmpq is None else dataclasses.asdict(self.dmpq),
            "static": None if self.static is None else self.static.to_dict(),
            "cache": None if self.cache is None else dataclasses.asdict(self.cache),
            "attention": None if self.attention is None else dataclasses.asdict(self.attention),
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConvertConfig:
        """Build from ``to_dict()``'s shape; every problem (unknown keys included) in one error."""
        if not isinstance(data, dict):
            raise ValueError(f"a ConvertConfig must be a JSON object, got {type(data).__name__}")
        problems, kwargs = [], {}
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = set(data) - set(fields)
        if unknown:
            problems.append(unknown_keys(unknown, fields))
        builders = {
            "weights": QuantConfig.from_dict,
            "dmpq": lambda d: _plain_from_dict(DMPQConfig, d),
            "static": StaticW8A8Config.from_dict,
            "cache": lambda d: _plain_from_dict(DeltaCacheConfig, d),
            "attention": lambda d: _plain_from_dict(AttentionQuantConfig, d),
        }
        for key in fields:
            if key not in data:
                continue
            value = data[key]
            if key in builders and value is not None:
                if not isinstance(value, dict):
                    problems.append(f"{key} must be an object or null, got {value!r}")
                    continue
                try:
                    value = builders[key](value)
                except (ValueError, TypeError) as e:
                    problems.append(f"{key}: " + str(e).replace("\n", "\n    "))
                    continue
            kwargs[key] = value
        if data.get("activations", "dynamic") not in ACTIVATIONS:
            problems.append(f"activations={data['activations']!r} is not one of {list(ACTIVATIONS)}")
        if not problems:
            try:
                return cls(**kwargs)
            except ValueError as e:
                problems.append(str(e).replace("\n", "\n    "))
        raise ValueError(report("invalid conversion config", problems))


def _plain_from_dict(cls, data: dict[str, Any]):
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - fields
    if unknown:
        raise ValueError(unknown_keys(unknown, fields))
    return cls(**data)


# The 4-bit weight recipe of every W4 preset, chosen by bench_weights.py (BENCHMARKS.md,
# "4-bit weights"): NVFP4 with Hadamard 128, block scales searched by Hessian-weighted MSE, GPTQ
# (needs calibration), a 16-bit low-rank branch of ≤ 0.5 bit per weight and rank ≤ 16 on the
# compute layers (rank 3–4 at the shipped models' width 192; 16 from width ~1000 up, 0.27 bit at
# 1920, 0.1 bit at 5120), and the modulation linears in NVFP4, weight-only. The rank cap is what
# brings CogVideoX-2B to the paper's 3.3× fewer bytes than bf16 (uncapped, r = 30: 3.21×);
# bench_real_size.py measures it. Embedding and output layers stay in full precision: NVFP4
# there cost 3–7 dB on the shipped models.
W4_RECIPE: dict[str, Any] = dict(scale_rule="mse", gptq=True, lowrank_bits=0.5, lowrank_max_rank=16,
                                 role_formats={"modulation": "nvfp4"})


def _w4(act: str, **quant) -> dict[str, Any]:
    recipe = {**copy.deepcopy(W4_RECIPE), **quant}
    return {"weights": QuantConfig(weight_format="nvfp4", hadamard_block=128, **recipe), "activations": act}


def _w4_rtn(act: str) -> dict[str, Any]:
    """The reference: NVFP4 rounded to nearest, attention and feed-forward only (no calibration)."""
    return {"weights": QuantConfig(weight_format="nvfp4", hadamard_block=128), "activations": act}


# Cache thresholds come from the cache benchmark (BENCHMARKS.md): the default 0.2 skips ≈ 45 % of
# block calls of the full-precision shapes models at 20 steps; 0.3 reaches ≈ 50–55 %.
_PRESETS: dict[str, dict[str, Any]] = {
    "balanced": dict(
        **_w4("dynamic"), dmpq=DMPQConfig(target_bits=6.0, low="auto"), cache=DeltaCacheConfig(),
        description="the full method: NVFP4 weights (GPTQ, searched scales, low-rank branch), DMPQ activations (NVFP4/INT8 per block and step, target 6 bits, where the device has FP4 GEMMs; INT8 elsewhere), delta cache with PDR",
    ),
    "high_quality": dict(
        weights=QuantConfig(weight_format="int8", boundary_blocks=1, boundary_format=None), activations="int8",
        description="INT8 weights and activations (real integer GEMM), first and last block in full precision, no cache",
    ),
    "aggressive": dict(
        **_w4("nvfp4"), cache=DeltaCacheConfig(threshold=0.3, error_budget=0.9, cache_format="int4-g64"),
        description="NVFP4 weights (GPTQ, searched scales, low-rank branch) and activations (emulated here), delta cache at threshold 0.3 with 4-bit residuals",
    ),
    "w8a8-static": dict(
        weights=None, activations="static", static=StaticW8A8Config.preset("w8a8-static"),
        description="static W8A8: every activation scale fixed offline per time range, SmoothQuant folded in",
    ),
    "w4a6-dynamic": dict(
        **_w4("dynamic"), dmpq=DMPQConfig(target_bits=6.0),
        description="NVFP4 weights (GPTQ, searched scales, low-rank branch), DMPQ activations (NVFP4/INT8 per block and step, ~6 bits), no cache",
    ),
    "w4a8": dict(**_w4("int8"), description="NVFP4 weights (GPTQ, searched scales, low-rank branch), per-token INT8 activations"),
    "w4a8-rtn": dict(**_w4_rtn("int8"), description="reference: NVFP4 weights rounded to nearest (Hadamard 128, attention and feed-forward only, no calibration), per-token INT8 activations"),
    "w4a4": dict(**_w4("nvfp4"), description="NVFP4 weights (GPTQ, searched scales, low-rank branch) and activations (emulated here)"),
    "w4a16": dict(**_w4("fp"), description="NVFP4 weights only (GPTQ, searched scales, low-rank branch), activations in full precision"),
    # The modulation linears (weight-only INT8) take CogVideoX-2B from 1.64x to 1.98x fewer bytes
    # than bf16 (they hold 20 % of its weights); measured on the shipped models at W8A16, 4 pairs:
    # -0.6 dB (CogVideoX, 52.5 dB), 0.0 dB (Wan). Embedding/output layers in INT8 cost 3-5 dB more.
    "w8a8": dict(
        weights=QuantConfig(weight_format="int8", role_formats={"modulation": "int8"}), activations="int8",
        description="INT8 weights (per channel; modulation layers weight-only) and activations (per token), real integer GEMM",
    ),
    "tdc": dict(
        weights=None, activations="fp", cache=DeltaCacheConfig(),
        description="delta cache only, on the full-precision model",
    ),
}


def preset(name: str) -> ConvertConfig:
    """A fresh :class:`ConvertConfig` for the preset ``name`` (see :data:`PRESETS`)."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(_PRESETS)}, a JSON file or a ConvertConfig")
    return ConvertConfig(**copy.deepcopy(_PRESETS[name]))


PRESETS: tuple[str, ...] = tuple(_PRESETS)

_SEED_KEYS = {"attention", "residual", "threshold"}
_SEED_ATTENTION_KEYS = {"bits", "symmetric"}
_RESIDUAL_FORMATS = {(4, 64): "int4-g64", (8, None): "int8", (16, None): "fp", (32, None): "fp"}


def _from_seed_shape(data: dict[str, Any]) -> ConvertConfig:
    problems = []
    cfg = preset("balanced")
    attention = data.get("attention")
    if attention is not None:
        if not isinstance(attention, dict) or set(attention) - {"bits", "symmetric"}:
            problems.append(f'"attention" must be {{"bits": 2…8, "symmetric": true|false}}, got {attention!r}')
        else:
            bits, symmetric = attention.get("bits", 8), attention.get("symmetric", True)
            if not isinstance(bits, int) or not 2 <= bits <= 8:
                problems.append(f'"attention.bits" must be an integer 2…8, got {bits!r}')
            elif not isinstance(symmetric, bool):
                problems.append(f'"attention.symmetric" must be true or false, got {symmetric!r}')
            else:
                cfg.weights.role_formats["attention"] = f"int{bits}" + ("" if symmetric else "-asym")
    residual = data.get("residual")
    if residual is not None:
        ok = isinstance(residual, dict) and not set(residual) - {"bits", "group_size"}
        key = (residual.get("bits"), residual.get("group_size")) if ok else None
        if key not in _RESIDUAL_FORMATS:
            problems.append(
                f'"residual" must be one of {{"bits": 4, "group_size": 64}}, {{"bits": 8}}, {{"bits": 16}}, '
                f"{{\"bits\": 32}}, got {residual!r}"
            )
        else:
            cfg.cache.cache_format = _RESIDUAL_FORMATS[key]
    if "threshold" in data:
        t = data["threshold"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            problems.append(f'"threshold" must be a number ≥ 0, got {t!r}')
        else:
            cfg.cache.threshold = float(t)
    if problems:
        raise ValueError(report("invalid conversion config", problems))
    cfg.description = "from the short JSON shape: " + json.dumps(data, sort_keys=True)
    try:  # re-validate the edited parts
        QuantConfig.from_dict(cfg.weights.to_dict())
        DeltaCacheConfig(**dataclasses.asdict(cfg.cache))
    except ValueError as e:
        raise ValueError(f"invalid conversion config: {e}") from None
    return cfg


def from_json_dict(data: Any) -> ConvertConfig:
    """A config from parsed JSON: the full schema (``to_dict()``) or the seed's short shape.

    The shape is told by the keys: a key of the short shape and none of the full schema is the
    short shape (an unknown key there is reported with the closest short-shape key); keys of
    both shapes, or none, are refused."""
    if not isinstance(data, dict):
        raise ValueError(f"a conversion config must be a JSON object, got {type(data).__name__}")
    if not data:
        raise ValueError(f"the conversion config is empty: name a preset ({', '.join(_PRESETS)}), or give at "
                         "least \"weights\" and \"activations\" (preset(name).to_dict() shows complete ones)")
    keys = set(data)
    seed, full = _shape_keys(data)
    if seed and full:
        raise ValueError(f"the config mixes the short shape's keys {sorted(seed)} with the full "
                         f"schema's {sorted(full)}: use one shape")
    if seed:
        if keys - _SEED_KEYS:
            raise ValueError(f"invalid conversion config (short shape): {unknown_keys(keys - _SEED_KEYS, _SEED_KEYS)}")
        return _from_seed_shape(data)
    return ConvertConfig.from_dict(data)


def _shape_keys(data: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(keys of the short shape, keys of the full schema) in ``data``. ``"attention"`` is in both:
    with ``bits``/``symmetric`` it is the short shape's, with ``blocks``/``steps`` the full
    schema's; otherwise (``null``, ``{}``) it goes with the other keys, and alone with the short
    shape (as before the full schema had it)."""
    full_fields = {f.name for f in dataclasses.fields(ConvertConfig)} - {"attention"}
    seed, full = set(data) & (_SEED_KEYS - {"attention"}), set(data) & full_fields
    if "attention" in data:
        attention = data["attention"]
        if isinstance(attention, dict) and set(attention) & _SEED_ATTENTION_KEYS:
            seed.add("attention")
        elif isinstance(attention, dict) and set(attention) & {f.name for f in dataclasses.fields(AttentionQuantConfig)}:
            full.add("attention")
        else:
            (full if full else seed).add("attention")
    return seed, full


def resolve(spec: str | os.PathLike | dict | ConvertConfig | QuantConfig) -> ConvertConfig:
    """Turn what a user passes as ``quant_config`` into a validated :class:`ConvertConfig`.

    ``spec``: a preset name (:data:`PRESETS`), a path to a ``.json`` file, a dict in either JSON
    shape, a :class:`ConvertConfig`, or a :class:`~sixbit.QuantConfig` (weights only; its
    ``act_mode`` becomes ``activations``).
    """
    if isinstance(spec, ConvertConfig):
        return spec
    if isinstance(spec, QuantConfig):
        return ConvertConfig(weights=spec, activations=spec.act_mode)
    if isinstance(spec, dict):
        return from_json_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        if isinstance(spec, str) and spec in _PRESETS:
            return preset(spec)
        path = Path(spec)
        if path.suffix.lower() == ".json" or path.is_file():
            data = read_json(path, "config file")
            try:
                return from_json_dict(data)
            except ValueError as e:
                raise ValueError(f"{str(path)!r}: {e}") from None
        raise ValueError(f"unknown preset {str(spec)!r}; choose one of {sorted(_PRESETS)}, or a path to a .json file")
    raise ValueError(
        f"quant_config must be a preset name, a .json path, a dict, a ConvertConfig or a QuantConfig, "
        f"got {type(spec).__name__}"
    )


_MAX_JSON = 1 << 20  # bytes: a conversion config is a few hundred


def read_json(path: Path, what: str) -> Any:
    """Parse the JSON file ``path`` strictly: at most 1 MiB, no ``NaN``/``Infinity`` (not JSON),
    nesting within Python's limits; every problem a one-line ``ValueError``."""
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    if path.stat().st_size > _MAX_JSON:
        raise ValueError(f"{what} {str(path)!r} is {path.stat().st_size} bytes; a config is at most {_MAX_JSON}: wrong file?")

    def refuse(constant):
        raise ValueError(f"{constant} is not standard JSON: write a finite number")

    try:
        return json.loads(path.read_text(), parse_constant=refuse)
    except RecursionError:
        raise ValueError(f"{what} {str(path)!r} is nested too deeply to be a config") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{what} {str(path)!r} is not valid JSON: {show(str(e), 200)}") from None


def for_device(config: ConvertConfig, device: torch.device | str) -> tuple[ConvertConfig, str | None]:
    """``config`` as it runs on ``device``, and a note saying what changed (``None``: nothing).

    A preset names an intent; its low-bit arithmetic takes the device's fastest real path.
    DMPQ with ``low="auto"`` (the ``balanced`` preset) chooses NVFP4 activations for speed, which
    only FP4 tensor cores deliver (:func:`sixbit.kernels.available`); on any other device NVFP4
    would be emulated — slower than INT8 — so every call runs at INT8 (a real integer GEMM) and
    no DMPQ predictor is fitted. Everything else runs as configured.

    Example:
        >>> config, note = for_device(resolve("balanced"), "cpu")
        >>> config.activations, note.startswith("DMPQ")
        ('int8', True)
    """
    device = torch.device(device)
    if config.activations != "dynamic" or config.dmpq.low != "auto" or fp4_supported(device):
        return config, None
    note = (f"DMPQ's low precision is NVFP4, which has no real GEMM on {device.type} "
            "(sixbit.kernels.available()): every call runs at INT8, the fastest real low-bit GEMM here")
    return dataclasses.replace(config, activations="int8", dmpq=None,
                               description=f"{config.description} [on {device.type}: INT8 activations everywhere]"), note
