"""Frame stabilization: quantize each token's temporal mean and its per-frame deviation apart.

Why videos flicker after activation quantization: a quantized linear rounds every token on
its own grid, so a background patch that is (nearly) the same in every frame picks up a
*different* rounding error in each frame, and the error shows up as frame-to-frame jitter.

For a linear layer ``y = W x`` and the video tokens ``x[f, s]`` (frame ``f``, spatial position
``s``), write ``x[f, s] = m[s] + r[f, s]`` with ``m`` the mean over frames. Then

    y[f, s] = W·Q(m[s]) + W·Q(r[f, s])

The first term's rounding error is the same in every frame (no flicker); the second term's
error scales with ``|r|``, which is small wherever the video is still. Both GEMMs run in the
layer's own activation precision (INT8 stays a real integer GEMM); the extra cost is one GEMM
on ``1/F`` of the video rows. Text tokens sharing a linear with the video (CogVideoX's joint
attention) are multiplied as usual.

**Temporal dead zone.** Decomposing alone leaves the model's function unchanged, and on the
shipped models it leaves flicker unchanged too: there, the frame-to-frame jitter of a converted
model is mostly the model's own, not per-frame rounding. So a token whose deviation from its
temporal mean is small — ``|r[f, s]| < deadzone · |m[s]|`` (L2 norms over channels) — is treated
as still: its deviation is set to zero before the GEMM, and that linear sees exactly the same
input in every frame. ``deadzone=0`` disables it (pure decomposition); the default of
``stabilize_frames=True`` is :data:`DEFAULT_DEADZONE`. This *changes* the computation (a
temporal smoothing of near-still tokens, like hysteresis on tiny changes): it trades fidelity to
the full-precision video for steadier backgrounds — measured in BENCHMARKS.md
(``stabilize-frames``), where PSNR vs a flickering full-precision reference also counts removed
jitter as error.

It acts only on calls whose precision (decided once per call, :mod:`sixbit.nn.precision`) is
a dynamically quantized one (int8/nvfp4, no static quantizer: static scales are calibrated on ``x``, not on ``m`` and ``r``), and only on models
whose :class:`~sixbit.models.ModelSpec` gives the token grid (``video_grid``). Layout config →
state → hook → ``apply_stabilizer``, like the other runtime methods.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from diffusers.hooks import ModelHook
from torch import nn

from ...models.registry import spec_for
from ...nn import execution, precision
from ...nn.precision import ActMode
from ...runtime import hooks
from ...runtime.blocks import quant_linears
from ...runtime.wrapped import changes_model

logger = logging.getLogger(__name__)

HOOK_NAME = "sixbit_stabilize"
DEFAULT_DEADZONE = 0.3  # relative deviation below which a token counts as still (see the module docstring)
GRID_HOOK_NAME = "sixbit_stabilize_grid"


@dataclasses.dataclass(frozen=True)
class StabilizeConfig:
    """Frame stabilization settings.

    Args:
        deadzone: relative deviation below which a token is treated as still (float ≥ 0,
            default :data:`DEFAULT_DEADZONE`). Higher: steadier, further from the full-precision
            video; ``0`` only decomposes (the model's function is unchanged).
    """

    deadzone: float = DEFAULT_DEADZONE

    def __post_init__(self):
        if isinstance(self.deadzone, bool) or not isinstance(self.deadzone, (int, float)) or not self.deadzone >= 0:
            raise ValueError(f"deadzone must be a number ≥ 0, got {self.deadzone!r}")

    @classmethod
    def from_argument(cls, stabilize_frames) -> StabilizeConfig | None:
        """The config ``convert_model(stabilize_frames=...)`` asks for: ``True`` (the default dead
        zone), a dead zone ≥ 0, or ``False``/``None`` (no stabilizer: ``None``)."""
        if stabilize_frames is False or stabilize_frames is None:
            return None
        if stabilize_frames is True:
            return cls()
        if isinstance(stabilize_frames, (int, float)) and stabilize_frames >= 0:
            return cls(float(stabilize_frames))
        raise ValueError(f"stabilize_frames must be True, False or a dead zone ≥ 0, got {stabilize_frames!r}")


class FrameStabilizer:
    """State of one model's stabilizer: the current call's token grid and usage counts."""

    def __init__(self, text_tokens: str | None, deadzone: float = 0.0):
        self.text_tokens = text_tokens
        self.deadzone = deadzone
        self.grid: tuple[int, int] | None = None
        self.stabilized_calls = 0
        self.plain_calls = 0


class _GridHook(ModelHook):
    """Reads the token grid (frames, tokens per frame) of each model call."""

    def __init__(self, state: FrameStabilizer, grid_fn):
        super().__init__()
        self.state, self.grid_fn = state, grid_fn

    def pre_forward(self, module, *args, **kwargs):
        self.state.grid = self.grid_fn(module, args, kwargs)
        return args, kwargs


def _split_rows(x: torch.Tensor, frames: int, per_frame: int, text_tokens: str | None):
    """(text rows before, video rows, text rows after) of ``x`` (B, N, C), or None if the rows don't fit."""
    n, v = x.shape[1], frames * per_frame
    if n == v:
        return None, x, None
    if n < v or text_tokens is None:
        return None
    if text_tokens == "first":
        return x[:, : n - v], x[:, n - v:], None
    return None, x[:, :v], x[:, v:]


class _StabilizeHook(ModelHook):
    def __init__(self, state: FrameStabilizer):
        super().__init__()
        self.state = state

    def new_forward(self, module, x, *args, **kwargs):
        forward = self.fn_ref.original_forward
        grid = self.state.grid
        mode = precision.decide(module, x)  # once: every GEMM below runs at it
        if grid is None or grid[0] < 2 or x.ndim != 3 or mode is ActMode.FP or execution.is_static(module):
            self.state.plain_calls += 1
            return forward(x, mode)
        frames, per_frame = grid
        parts = _split_rows(x, frames, per_frame, self.state.text_tokens)
        if parts is None:
            self.state.plain_calls += 1
            return forward(x, mode)
        before, video, after = parts
        b, _, c = video.shape
        v = video.reshape(b, frames, per_frame, c)
        mean = v.mean(dim=1)
        y_mean = forward(mean, mode)  # (B, S, O), bias included once
        dev = v - mean.unsqueeze(1)
        if self.state.deadzone > 0:
            rel = dev.norm(dim=-1, keepdim=True) / mean.norm(dim=-1, keepdim=True).unsqueeze(1).clamp_min(1e-12)
            dev = torch.where(rel < self.state.deadzone, torch.zeros_like(dev), dev)
        y_dev = forward(dev.reshape(b, frames * per_frame, c), mode)
        if module.bias is not None:
            y_dev = y_dev - module.bias.to(y_dev.dtype)
        y = (y_dev.reshape(b, frames, per_frame, -1) + y_mean.unsqueeze(1)).reshape(b, frames * per_frame, -1)
        pieces = [forward(before, mode)] if before is not None else []
        pieces.append(y)
        if after is not None:
            pieces.append(forward(after, mode))
        self.state.stabilized_calls += 1
        return torch.cat(pieces, dim=1) if len(pieces) > 1 else y


@changes_model("apply_stabilizer")
def apply_stabilizer(model: nn.Module, config: StabilizeConfig | None = None) -> FrameStabilizer:
    """Stabilize every quantized linear of ``model`` across frames; returns the state.

    ``config``: :class:`StabilizeConfig` (default: ``StabilizeConfig()``, the default dead zone).

    Example:
        >>> stab = apply_stabilizer(pipe.transformer, StabilizeConfig(deadzone=0.3))   # doctest: +SKIP
        >>> pipe("a red circle moving right"); stab.stabilized_calls > 0   # doctest: +SKIP
    """
    config = config or StabilizeConfig()
    if not isinstance(config, StabilizeConfig):
        raise ValueError(f"config must be a StabilizeConfig (e.g. StabilizeConfig(deadzone=0.3)), got {config!r}")
    spec = spec_for(model)
    if spec.video_grid is None:
        raise ValueError(
            f"frame stabilization needs the token grid of {type(model).__name__}, which its model metadata "
            f"({spec.name!r}) does not give; register a ModelSpec with video_grid=..., or use stabilize_frames=False"
        )
    layers = quant_linears(model)
    if not layers:
        raise ValueError("frame stabilization acts on quantized linears: quantize the model first")
    remove_stabilizer(model)
    state = FrameStabilizer(spec.text_tokens, float(config.deadzone))
    hooks.register(model, _GridHook(state, spec.video_grid), GRID_HOOK_NAME)
    for layer in layers:
        hooks.register(layer, _StabilizeHook(state), HOOK_NAME)
    return state


@changes_model("remove_stabilizer")
def remove_stabilizer(model: nn.Module) -> None:
    """Remove the stabilizer's hooks (no-op when there are none)."""
    for module in [model, *quant_linears(model)]:
        for name in (GRID_HOOK_NAME, HOOK_NAME):
            hooks.remove(module, name)
