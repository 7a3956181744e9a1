"""Every method ``sixbit bench`` can run, ours and the peers', in one registry.

A method name is a registered base name, optionally followed by ``-VALUE`` to set the method's
one knob (its :attr:`Method.param`): ``fbcache-0.2`` is FirstBlockCache at threshold 0.2, ``pab-3``
PyramidAttentionBroadcast skipping 3 steps, ``tdc-0.8`` our delta cache at error budget 0.8,
``tdc-min-35`` with its budget calibrated to 35 dB. Our methods are the presets of
:mod:`sixbit.presets` (``balanced``, ``w8a8-static``, ``w4a6-dynamic``, …), converted with
:func:`sixbit.convert_model` on calibration generations made with the benchmark's own steps and CFG.

cache-dit's DBCache (family ``cache-dit``, the ``bench`` extra) is registered as
``dbcache``, ``dbcache-ts1``, ``dbcache-ts2`` (TaylorSeer calibrator of order 1, 2),
``dbcache-f1b1``, ``dbcache-f1b1-ts1`` (Fn=1 front and Bn=1 back compute blocks) and
``dbcache-nocap``; ``-VALUE`` is the residual-diff threshold (default 0.12), every variant but
``nocap`` caps cached steps in a row at 3, and all compute Fn=1 front blocks. What each sets and
what cache-dit needs from a pipeline: :mod:`sixbit.bench.peer_cache_dit`.

A peer whose library is missing or that fails here is reported with the reason, not dropped
(:meth:`Method.unavailable`, and the harness catches errors while applying it).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import logging
import re
from collections.abc import Callable

import torch
from torch import nn

from ..config import Activations
from ..convert import conversion_of, convert_model
from .. import kernels
from ..methods.attention import AttentionQuantConfig, apply_attention_quant
from ..presets import PRESETS, for_device, preset
from ..runtime import track_steps
from .counting import default_precision
from .peer_cache_dit import VARIANTS as CACHE_DIT_VARIANTS
from .peer_cache_dit import apply_dbcache

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class BenchContext:
    """What a method may use while it is applied: the benchmark's settings and a calibration run.

    ``calibrate(pipe)`` generates the calibration prompts with ``pipe`` (the benchmark's steps,
    CFG and their own seeds, never the evaluation seeds).
    """

    arch: str
    steps: int
    guidance: float
    calibrate: Callable[[object], object]
    calibration_prompts: int


@dataclasses.dataclass(frozen=True)
class Method:
    """One entry of the registry.

    Attributes:
        name: base name used in ``--methods``.
        family: who provides it (``"sixbit"``, ``"diffusers"``, ``"cache-dit"``, ``"torchao"``, ``"optimum-quanto"``, ``"reference"``).
        description: one line for the tables.
        apply: ``apply(pipe, context, value) -> note`` changes ``pipe`` in place; the note goes in the table.
        param: what ``-VALUE`` sets (``None``: no knob); without ``-VALUE`` the library's default applies.
        requires: modules that must import for the method to run.
        precision_of: a linear's activation precision for a call (FLOP counting).
        emulated: its low-bit arithmetic is emulated on this device (time is not hardware speed).
    """

    name: str
    family: str
    description: str
    apply: Callable
    param: str | None = None
    requires: tuple[str, ...] = ()
    precision_of: Callable[[nn.Module], str] = default_precision
    emulated: bool = False

    def unavailable(self) -> str | None:
        """Why this method cannot run here, or ``None``."""
        for module in self.requires:
            try:
                importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - any import failure means "cannot run", with its reason
                return f"`{module}` does not import ({type(e).__name__}: {str(e).splitlines()[0][:120]}); `pip install sixbit-diffusion[bench]`"
        return None


PEERS: dict[str, Method] = {}


def register(method: Method) -> Method:
    if method.name in PEERS:
        raise ValueError(f"method {method.name!r} is registered twice")
    PEERS[method.name] = method
    return method


# ------------------------------------------------------------------------ reference


def _apply_fp(pipe, ctx, value):
    return "float32, no change"


register(Method("fp", "reference", "the shipped model in full precision (reference of PSNR/SSIM)", _apply_fp))


def _apply_bf16(pipe, ctx, value):
    pipe.transformer.to(torch.bfloat16)
    return "bfloat16 transformer: what a user runs where bf16 is the fastest full-precision dtype"


register(Method("bf16", "reference", "the shipped transformer in bfloat16", _apply_bf16))


# ------------------------------------------------------------------------ ours (sixbit presets)


def _preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def _apply_preset(name, ablation: str = "", knob: str = "error_budget", **cache_changes):
    """Apply preset ``name``; ``cache_changes`` alter its delta cache (an ablation, named in the note);
    ``-VALUE`` sets the cache's ``knob``: its error budget, or ``min_psnr`` (calibrated on the
    benchmark's calibration prompts), or for the rule before issue 62 its threshold (budget 3×)."""

    def apply(pipe, ctx, value):
        config = preset(name)
        if cache_changes:
            config.cache = dataclasses.replace(config.cache, **cache_changes)
        note = f"{ablation}; " if ablation else ""
        if value is not None:
            if config.cache is None:
                raise ValueError(f"preset {name!r} has no delta cache: it takes no -{knob} suffix")
            extra = {"error_budget": 3 * value} if knob == "threshold" else {}
            config.cache = dataclasses.replace(config.cache, **{knob: value}, **extra)
            note += f"{knob} {value:g}; "
        calibration = (lambda: ctx.calibrate(pipe)) if config.needs_calibration else None
        convert_model(pipe, calibration, config)
        if calibration is not None:
            note += f"calibrated on {ctx.calibration_prompts} prompts; "
        cache = conversion_of(pipe).config.cache
        if cache is not None and cache.calibrated is not None:
            c = cache.calibrated
            note += (f"chose error_budget {cache.error_budget:g} ({c['psnr_bound']} dB mean − 1 SE on them, "
                     f"{c['runs']} runs, {c['seconds']:.1f} s), at most {100 * cache.max_skip_share:.0f} % of steps "
                     "skipped; ")
        return note + (config.description or name)

    return apply


def _emulated(config) -> bool:
    """Whether ``config`` runs NVFP4 activations emulated on this machine's device."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    nvfp4 = for_device(config, device)[0].activations in (Activations.NVFP4, Activations.DYNAMIC)
    return nvfp4 and not kernels.fp4_supported(device)


def _preset_method(name: str) -> Method:
    config = preset(name)
    emulated = _emulated(config)
    return Method(
        name, "sixbit", config.description or name, _apply_preset(name),
        param="error_budget" if config.cache is not None else None, emulated=emulated,
    )


if "balanced" in _preset_names():  # issue 7's ablations
    register(Method("balanced-nopdr", "sixbit", "balanced without PDR (DMPQ + delta cache only)",
                    _apply_preset("balanced", "PDR off", pdr=False), param="error_budget",
                    emulated=_preset_method("balanced").emulated))
    register(Method("aggressive-nopdr", "sixbit", "aggressive without PDR (its refreshes stay NVFP4)",
                    _apply_preset("aggressive", "PDR off", pdr=False), param="error_budget", emulated=True))
    for label, (words, change) in {  # the delta cache's ablations: name → (what it changes, in words; the change)
        "perblock": ("each block deciding alone", dict(decide_per_block=True)),
        **{label: (f"replaying {drift:g} of the measured drift (1: first-order Taylor extrapolation; default 0.7)",
                   dict(drift=drift)) for drift, label in ((0.0, "nodrift"), (0.5, "drift05"), (1.0, "drift1"))},
        "notail": ("without tail_fraction (streaks may run into the last tenth of the steps)", dict(tail_fraction=0.0)),
        "f10": ("with final_fraction 0.1 (the last tenth always computed; the default until issue 62's last change, "
                "at budget 1.3)", dict(final_fraction=0.1)),
        "w10": ("with a 10 % warm-up (default 20 %): the only way past 75 % skipped at 20 steps",
                dict(warmup_fraction=0.1))}.items():
        register(Method(f"tdc-{label}", "sixbit", f"the delta cache {words}", _apply_preset("tdc", words, **change),
                        param="error_budget"))
    # the rule before issue 62: a stability threshold, two skips in a row at most, a budget of 3× the threshold
    register(Method("tdc-v1", "sixbit", "the delta cache's rule before issue 62 (threshold, budget 3×, s·k per skip, "
                    "≤ 2 skips in a row, drift 0.5); -VALUE: its threshold (default 0.2)",
                    _apply_preset("tdc", "the earlier rule", knob="threshold", threshold=0.2, error_budget=0.6, max_skips=2,
                                  final_fraction=0.0, tail_fraction=0.0, drift=0.5, age_exponent=1), param="threshold"))
    for base in ("tdc", "balanced"):  # the budget calibrated to a PSNR target (DeltaCacheConfig(min_psnr=...))
        register(Method(f"{base}-min", "sixbit", f"{base} with its cache's error budget calibrated to -VALUE dB "
                        "(mean − 1 SE of the calibration videos against the uncached FP model)",
                        _apply_preset(base, knob="min_psnr"), param="min_psnr", emulated=_preset_method(base).emulated))


def _apply_int8_attention(pipe, ctx, value, p_format="fp16"):
    start = None if value is None else int(value)
    state = apply_attention_quant(pipe.transformer, AttentionQuantConfig(steps=(start, None), p_format=p_format))
    p = "FP16 PV" if p_format == "fp16" else f"{p_format.upper()} P"
    return f"INT8 QKᵀ (K smoothed) + {p}, {'every step' if start is None else f'from step {start}'}; {state.path}"


register(Method("int8-attention", "sixbit", "quantized attention (SageAttention's method) on the full-precision model",
                _apply_int8_attention, param="first quantized step",
                emulated=not torch.cuda.is_available() or importlib.util.find_spec("sageattention") is None))
for _p in ("int8", "e2m3", "e3m2"):  # the attention matrix P rounded before P·V (seed 000's 6-bit P: e2m3, e3m2)
    register(Method(f"int8-attention-p-{_p}", "sixbit", f"quantized attention with P in {_p.upper()} (scale per 32 keys)",
                    functools.partial(_apply_int8_attention, p_format=_p), param="first quantized step",
                    emulated=not torch.cuda.is_available() or _p == "int8"))


# ------------------------------------------------------------------------ diffusers caches


def _enable_with_tracker(pipe, make_config):
    """PAB and FasterCache ask for the current timestep through a callback; sixbit's step tracker knows it."""
    holder = {}
    pipe.transformer.enable_cache(make_config(lambda: holder["tracker"].info.timestep))
    # installed after the cache's hooks, the tracker runs first: callbacks see this call's timestep
    holder["tracker"] = track_steps(pipe.transformer)


def _apply_fbcache(pipe, ctx, value):
    from diffusers.hooks import FirstBlockCacheConfig

    config = FirstBlockCacheConfig() if value is None else FirstBlockCacheConfig(threshold=value)
    pipe.transformer.enable_cache(config)
    return f"threshold {config.threshold:g}"


def mag_ratios(pipe, ctx) -> list[float]:
    """MagCache's own calibration mode on the calibration prompts; the ratios are read from its log."""
    from diffusers.hooks import MagCacheConfig
    from diffusers.utils import logging as dlog

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda rec: records.append(rec.getMessage())
    log = logging.getLogger("diffusers.hooks.mag_cache")
    log.addHandler(handler)
    old = dlog.get_verbosity()
    dlog.set_verbosity_info()
    try:
        pipe.transformer.enable_cache(MagCacheConfig(calibrate=True, num_inference_steps=ctx.steps))
        ctx.calibrate(pipe)
    finally:
        dlog.set_verbosity(old)
        log.removeHandler(handler)
        pipe.transformer.disable_cache()
    found = [m for m in records if "Calibration Results" in m]
    if not found:
        raise RuntimeError("MagCache calibration logged no ratios")
    return [float(v) for v in re.findall(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?", found[0].split(":", 1)[1])]


def _apply_magcache(pipe, ctx, value):
    from diffusers.hooks import MagCacheConfig

    ratios = mag_ratios(pipe, ctx)
    kwargs = {} if value is None else {"threshold": value}
    config = MagCacheConfig(num_inference_steps=ctx.steps, mag_ratios=ratios, **kwargs)
    pipe.transformer.enable_cache(config)
    return f"threshold {config.threshold:g}; ratios calibrated on {ctx.calibration_prompts} prompts"


# diffusers' default identifiers ("^transformer_blocks.*attn", "^blocks.*attn") match no module of
# these models under re.fullmatch (their attentions are named attn1/attn2): name them explicitly.
TAYLORSEER_IDENTIFIERS = [r"(transformer_blocks|blocks)\.\d+\.attn\d"]


def _apply_taylorseer(pipe, ctx, value):
    from diffusers.hooks import TaylorSeerCacheConfig

    interval = 5 if value is None else int(value)
    pipe.transformer.enable_cache(TaylorSeerCacheConfig(
        cache_interval=interval, disable_cache_before_step=2, taylor_factors_dtype=torch.float32,
        cache_identifiers=TAYLORSEER_IDENTIFIERS,
    ))
    return f"cache_interval {interval}; identifiers {TAYLORSEER_IDENTIFIERS[0]} (the defaults match nothing here)"


def _apply_pab(pipe, ctx, value):
    from diffusers.hooks import PyramidAttentionBroadcastConfig

    skip = 2 if value is None else int(value)
    _enable_with_tracker(pipe, lambda current: PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=skip, spatial_attention_timestep_skip_range=(100, 900),
        current_timestep_callback=current,
    ))
    return f"spatial attention skip range {skip}, timesteps 100–900"


def _apply_fastercache(pipe, ctx, value):
    from diffusers.hooks import FasterCacheConfig

    skip = 2 if value is None else int(value)
    _enable_with_tracker(pipe, lambda current: FasterCacheConfig(
        spatial_attention_block_skip_range=skip, spatial_attention_timestep_skip_range=(-1, 901),
        current_timestep_callback=current, attention_weight_callback=lambda _: 0.5,
        tensor_format="BFCHW" if ctx.arch == "cogvideox" else "BCFHW", is_guidance_distilled=ctx.arch == "wan",
    ))
    return f"spatial attention skip range {skip}; attention weight 0.5"


register(Method("fbcache", "diffusers", "FirstBlockCache (diffusers)", _apply_fbcache, "threshold"))
register(Method("magcache", "diffusers", "MagCache (diffusers), calibrated on this model", _apply_magcache, "threshold"))
register(Method("taylorseer", "diffusers", "TaylorSeerCache (diffusers)", _apply_taylorseer, "cache_interval"))
register(Method("pab", "diffusers", "PyramidAttentionBroadcast (diffusers)", _apply_pab, "skip range"))
register(Method("fastercache", "diffusers", "FasterCache (diffusers)", _apply_fastercache, "skip range"))


# ------------------------------------------------------------------------ cache-dit (its DBCache; see peer_cache_dit)


def _apply_cache_dit(variant):
    return lambda pipe, ctx, value: apply_dbcache(pipe, ctx, value, variant)


for _variant in CACHE_DIT_VARIANTS:
    register(Method(_variant.name, "cache-dit", _variant.description, _apply_cache_dit(_variant),
                    "residual_diff_threshold", requires=("cache_dit",)))


# ------------------------------------------------------------------------ quantization peers


def _subclass_weight(layer: nn.Module) -> bool:
    w = getattr(layer, "weight", None)
    return w is not None and type(w) not in (torch.Tensor, nn.Parameter)


def _apply_torchao(pipe, ctx, value):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(pipe.transformer, Int8DynamicActivationInt8WeightConfig())
    n = sum(1 for m in pipe.transformer.modules() if isinstance(m, nn.Linear) and _subclass_weight(m))
    return f"torchao quantize_ on {n} linears"


def _apply_quanto(bits):
    def apply(pipe, ctx, value):
        from optimum import quanto

        quanto.quantize(pipe.transformer, weights=getattr(quanto, f"qint{bits}"))
        quanto.freeze(pipe.transformer)
        return f"optimum-quanto qint{bits} weights, activations in full precision"

    return apply


register(Method(
    "torchao-int8dq", "torchao", "torchao Int8DynamicActivationInt8WeightConfig", _apply_torchao,
    requires=("torchao",), precision_of=lambda m: "int8" if _subclass_weight(m) else "fp",
))
register(Method("quanto-qint8", "optimum-quanto", "optimum-quanto qint8 weights", _apply_quanto(8), requires=("optimum.quanto",)))
register(Method("quanto-qint4", "optimum-quanto", "optimum-quanto qint4 weights", _apply_quanto(4), requires=("optimum.quanto",)))


# ------------------------------------------------------------------------ lookup


def available_names() -> list[str]:
    """Every base name ``--methods`` accepts (ours first)."""
    return ["fp", *_preset_names(), *(n for n in PEERS if n != "fp")]


def resolve(name: str) -> tuple[Method, float | None]:
    """``(method, knob value or None)`` of a ``--methods`` entry such as ``fbcache-0.2``."""
    name = name.strip()
    presets = _preset_names()
    base, value = name, None
    if name not in PEERS and name not in presets and "-" in name:
        head, _, tail = name.rpartition("-")
        try:
            base, value = head, float(tail)
        except ValueError:
            pass
    if base in presets:
        method = _preset_method(base)
    elif base in PEERS:
        method = PEERS[base]
    else:
        knobs = ", ".join(f"{n}-<{m.param}>" for n, m in PEERS.items() if m.param)
        raise ValueError(
            f"unknown method {name!r}; valid: {', '.join(available_names())} "
            f"(append -VALUE to set a knob: {knobs}, or a cached preset's error budget, e.g. tdc-0.8)"
        )
    if value is not None and method.param is None:
        raise ValueError(f"method {base!r} has no knob to set with {name!r}; use plain {base!r}")
    return method, value
