"""What :func:`sixbit.convert_model` does to a model: :class:`ConvertConfig` and its :class:`Activations`."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator

from .validate import report, show, type_problems
from .attention import AttentionQuantConfig
from .delta_cache import DeltaCacheConfig
from .dmpq import DMPQConfig
from .quant import QuantConfig
from .method_types import config_type_of, name_of
from .serialize import Serializable, from_dict, to_dict
from .static_w8a8 import StaticW8A8Config

# the built-in methods' config types, each with its own field of ConvertConfig
_OWN_FIELDS = {DMPQConfig: "dmpq", StaticW8A8Config: "static", DeltaCacheConfig: "cache",
               AttentionQuantConfig: "attention"}


class Activations(enum.StrEnum):
    """How a conversion quantizes activations.

    Three fixed precisions for every call (``fp``, ``int8``, ``nvfp4``: the
    :class:`~sixbit.nn.ActMode` of the same name) and two calibrated methods (``dynamic``: DMPQ,
    ``static``: static W8A8). A string enum: ``Activations.INT8 == "int8"``, JSON writes
    ``"int8"``, and its ``repr`` is the value's, so messages read ``activations='int8'``.
    """

    FP = "fp"
    INT8 = "int8"
    NVFP4 = "nvfp4"
    DYNAMIC = "dynamic"
    STATIC = "static"

    def __repr__(self) -> str:
        return repr(self.value)

    @property
    def calibrated(self) -> bool:
        """Whether these activations are fitted on calibration generations (DMPQ, static W8A8)."""
        return self in (Activations.DYNAMIC, Activations.STATIC)


@dataclasses.dataclass
class ConvertConfig(Serializable):
    """A whole conversion: weights, activations, cache, attention.

    Args:
        weights: how linears are quantized (:class:`~sixbit.QuantConfig`); ``None`` keeps the
            model in full precision (cache-only configs). Must be ``None`` with
            ``activations="static"``, whose ``static`` config quantizes the weights itself.
        activations: an :class:`Activations` or its value: ``"fp"`` (weight-only), ``"int8"``
            (per-token INT8, real integer GEMM), ``"nvfp4"`` (NVFP4 × NVFP4, emulated on this
            hardware), ``"dynamic"`` (DMPQ: NVFP4 or INT8 per block and step, needs calibration)
            or ``"static"`` (static W8A8: every scale fixed offline per time range, needs
            calibration). A string is normalized to the enum.
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
        methods: the configs of further runtime methods (default none), each of the type a
            registered method is chosen by (:func:`sixbit.methods.registry.register_method`),
            one per method; stored in JSON and checkpoints under the method's name. The built-in
            methods' configs have their own fields above.

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
    activations: Activations = Activations.DYNAMIC
    dmpq: DMPQConfig | None = None
    static: StaticW8A8Config | None = None
    cache: DeltaCacheConfig | None = None
    attention: AttentionQuantConfig | None = None
    description: str = ""
    methods: tuple = ()

    def __post_init__(self):
        given = self.activations
        try:
            self.activations = Activations(given)
        except (ValueError, TypeError):
            self.activations = Activations.FP  # a placeholder: the config is refused below
            problems = type_problems(self) + [f"activations={show(given)} is not one of {[a.value for a in Activations]}"]
            raise ValueError(report("invalid ConvertConfig", problems)) from None
        if isinstance(self.methods, list):
            self.methods = tuple(self.methods)
        problems = type_problems(self) + self._method_problems() + self._extra_method_problems()
        if self.weights is not None and self.weights.act_mode not in ("fp", self.activations):
            problems.append(f"weights.act_mode={self.weights.act_mode!r} contradicts activations={self.activations!r}: "
                            "set the precision in activations (weights.act_mode is for sixbit.quantize alone)")
        if problems:
            raise ValueError(report("invalid ConvertConfig", problems))

    def _method_problems(self) -> list[str]:
        """Which method configs ``activations`` asks for, filling in the defaults it implies."""
        problems = []
        if self.activations == Activations.STATIC:
            if self.weights is not None:
                problems.append('activations="static" quantizes the weights itself: set weights=None')
            if self.static is None:
                self.static = StaticW8A8Config.preset("w8a8-static")
        elif self.static is not None:
            problems.append(f'static is set but activations={self.activations!r} (use activations="static")')
        elif self.activations != Activations.FP and self.weights is None:
            problems.append(f"activations={self.activations!r} needs quantized weights: set weights=QuantConfig(...)")
        if self.activations == Activations.DYNAMIC:
            self.dmpq = self.dmpq or DMPQConfig()
        elif self.dmpq is not None:
            problems.append(f'dmpq is set but activations={self.activations!r} (use activations="dynamic")')
        return problems

    def _extra_method_problems(self) -> list[str]:
        problems, seen = [], set()
        for config in self.methods:
            kind = type(config)
            if kind in _OWN_FIELDS:
                problems.append(f"methods holds a {kind.__name__}: set it as ConvertConfig.{_OWN_FIELDS[kind]}")
            elif name_of(kind) is None:
                problems.append(f"methods holds {show(config)}, whose type no registered runtime method is chosen by: "
                                "register the method first (sixbit.methods.registry.register_method)")
            elif kind in seen:
                problems.append(f"methods holds two {kind.__name__}: one config per method")
            seen.add(kind)
        return problems

    def method_configs(self) -> Iterator:
        """The runtime methods' configs this conversion sets (``dmpq``, ``static``, ``cache``,
        ``attention``; ``None`` ones left out; then ``methods``): a method is chosen by its config's type.

        Example:
            >>> [type(c).__name__ for c in ConvertConfig(activations="int8", cache=DeltaCacheConfig()).method_configs()]
            ['DeltaCacheConfig']
        """
        for config in (self.dmpq, self.static, self.cache, self.attention, *self.methods):
            if config is not None:
                yield config

    def method_config(self, config_type: type):
        """The config of type ``config_type`` this conversion sets, or ``None``."""
        return next((c for c in self.method_configs() if type(c) is config_type), None)

    def with_method(self, config_type: type, config) -> ConvertConfig:
        """This config with the method config of ``config_type`` replaced by ``config`` (``None``: removed)."""
        if config_type in _OWN_FIELDS:
            return dataclasses.replace(self, **{_OWN_FIELDS[config_type]: config})
        others = tuple(c for c in self.methods if type(c) is not config_type)
        return dataclasses.replace(self, methods=others + (() if config is None else (config,)))

    def to_dict(self) -> dict:
        """The JSON form; ``methods`` by method name, and only when set (a config without one is
        written as before the field existed, and loads in a sixbit that predates it)."""
        data = super().to_dict()
        if self.methods:
            data["methods"] = {name_of(type(c)): to_dict(c) for c in self.methods}
        else:
            del data["methods"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ConvertConfig:
        """Read :meth:`to_dict`'s form; each ``methods`` entry becomes its registered config type."""
        if not (isinstance(data, dict) and "methods" in data):
            return super().from_dict(data)
        stored, problems, configs = data["methods"], [], []
        if not isinstance(stored, dict):
            raise ValueError(report("invalid ConvertConfig", [f"methods must be an object (method name: its config), "
                                                              f"got {show(stored)}"]))
        for name, value in stored.items():
            try:
                configs.append(from_dict(config_type_of(name), value))
            except (ValueError, TypeError) as e:
                problems.append(f"methods.{name}: " + str(e).replace("\n", "\n    "))
        if problems:
            raise ValueError(report("invalid ConvertConfig", problems))
        config = super().from_dict({k: v for k, v in data.items() if k != "methods"})
        return dataclasses.replace(config, methods=tuple(configs))

    @property
    def needs_calibration(self) -> bool:
        """Whether converting with this config runs calibration generations (DMPQ, static W8A8, GPTQ,
        the delta cache's ``min_psnr``)."""
        return (self.activations.calibrated or (self.weights is not None and self.weights.needs_calibration)
                or (self.cache is not None and self.cache.needs_calibration))

    def calibration_reason(self) -> str | None:
        """What needs calibration, in words (``None`` when nothing does)."""
        if self.activations.calibrated:
            return f"activations={self.activations!r}"
        if self.weights is not None and self.weights.needs_calibration:
            w = self.weights
            return ("GPTQ weights (gptq=True)" if w.gptq else "smoothed weights (smooth_alpha)" if w.smooth_alpha is not None
                    else "refined low-rank branches (refine_steps)")
        if self.cache is not None and self.cache.needs_calibration:
            return f"the delta cache's min_psnr={self.cache.min_psnr:g}"
        return None
