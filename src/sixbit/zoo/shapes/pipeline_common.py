"""What both shapes pipelines share: prompt checks, noise, guidance, the output type.

The two pipelines differ only in how they call the transformer per step (CogVideoX batches the
conditional and unconditional branch in one call; Wan calls once per branch inside diffusers'
``cache_context``), so the sampling loop lives in each pipeline and the rest lives here.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

from .world import HEIGHT, NUM_FRAMES, WIDTH

OUTPUT_TYPES = ("np", "pil", "pt")


@dataclasses.dataclass
class ShapesPipelineOutput(BaseOutput):
    """``frames``: (B, F, H, W, 3) float numpy in [0, 1] (``"np"``), B lists of F PIL images
    (``"pil"``) or a (B, F, 3, H, W) tensor in [0, 1] (``"pt"``)."""

    frames: Any


class ShapesPipelineBase(DiffusionPipeline):
    """Shared helpers; subclasses implement ``__call__``."""

    model_cpu_offload_seq = "text_encoder->transformer"
    _callback_tensor_inputs = ["latents"]
    #: (frames, height, width) it was trained on and makes by default: calibration videos are resized to it
    video_size = (NUM_FRAMES, HEIGHT, WIDTH)
    #: the largest (frames, height, width) its position embedding reaches
    max_video_size: tuple[int, int, int] = (NUM_FRAMES, HEIGHT, WIDTH)
    #: the transformer's (time, height, width) patch: a video's sizes are multiples of it
    patch = (2, 4, 4)

    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1.0

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def _check_inputs(self, prompt, num_inference_steps, guidance_scale, output_type, callback_inputs):
        if isinstance(prompt, str):
            prompt = [prompt]
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(p, str) for p in prompt) or not prompt:
            raise ValueError(f"prompt must be a string or a non-empty list of strings, got {prompt!r}")
        if int(num_inference_steps) < 1:
            raise ValueError(f"num_inference_steps={num_inference_steps} must be >= 1")
        if guidance_scale < 0:
            raise ValueError(f"guidance_scale={guidance_scale} must be >= 0 (1 disables guidance)")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r} is not one of {OUTPUT_TYPES}")
        bad = [k for k in callback_inputs or [] if k not in self._callback_tensor_inputs]
        if bad:
            raise ValueError(f"callback_on_step_end_tensor_inputs {bad} not in {self._callback_tensor_inputs}")
        return list(prompt)

    def encode_prompt(self, prompts: list[str], num_videos_per_prompt: int = 1):
        """(conditional, unconditional) text embeddings, each (B * num_videos_per_prompt, L, D).

        The unconditional embedding is the empty prompt's (what CFG dropout trained on)."""
        cond = self.text_encoder.encode(prompts).repeat_interleave(num_videos_per_prompt, dim=0)
        uncond = self.text_encoder.encode([""]).expand_as(cond)
        dtype = self.transformer.dtype
        return cond.to(dtype), uncond.to(dtype)

    def check_video_size(self, num_frames: int | None, height: int | None, width: int | None) -> tuple[int, int, int]:
        """``(num_frames, height, width)`` of a call, the trained size where ``None``; sizes the
        transformer cannot take are refused, naming the ones it can."""
        size = tuple(d if x is None else x for x, d in zip((num_frames, height, width), self.video_size))
        names = ("num_frames", "height", "width")
        for name, x, p, most in zip(names, size, self.patch, self.max_video_size):
            if not isinstance(x, int) or isinstance(x, bool) or x < p or x % p or x > most:
                raise ValueError(f"{name}={x!r}: this pipeline takes multiples of {p} from {p} to {most} "
                                 f"(trained on {dict(zip(names, self.video_size))})")
        return size

    def prepare_latents(self, batch_size, generator, device, dtype, layout: str, latents=None,
                        size: tuple[int, int, int] = (NUM_FRAMES, HEIGHT, WIDTH)):
        """Gaussian noise of ``size`` (frames, height, width) in the transformer's layout (``"BFCHW"`` or ``"BCFHW"``)."""
        frames, height, width = size
        shape = (batch_size, frames, 3, height, width)
        if layout == "BCFHW":
            shape = (batch_size, 3, frames, height, width)
        if latents is not None:
            if tuple(latents.shape) != shape:
                raise ValueError(f"latents have shape {tuple(latents.shape)}; expected {shape}")
            return latents.to(device=device, dtype=dtype)
        if isinstance(generator, list) and len(generator) != batch_size:
            raise ValueError(f"got {len(generator)} generators for a batch of {batch_size} videos")
        return randn_tensor(shape, generator=generator, device=torch.device(device), dtype=dtype)

    def _step_kwargs(self, generator) -> dict[str, Any]:
        """``generator`` for the scheduler's step where it takes one: a stochastic sampler (e.g.
        ``FlowMatchEulerDiscreteScheduler(stochastic_sampling=True)``) then draws its per-step noise
        from the caller's generators and stays reproducible; a deterministic one ignores it."""
        return {"generator": generator} if "generator" in inspect.signature(self.scheduler.step).parameters else {}

    @staticmethod
    def _normalize_callback(callback, tensor_inputs):
        if isinstance(callback, (PipelineCallback, MultiPipelineCallbacks)):
            return callback, callback.tensor_inputs
        return callback, tensor_inputs

    def _run_callback(self, callback: Callable | None, tensor_inputs, i, t, latents):
        if callback is None:
            return latents
        local = {"latents": latents}
        out = callback(self, i, t, {k: local[k] for k in tensor_inputs})
        return out.pop("latents", latents) if out else latents

    def postprocess(self, video: torch.Tensor, layout: str, output_type: str):
        """Model output in [-1, 1] -> frames in [0, 1] in the requested output type."""
        if layout == "BCFHW":
            video = video.transpose(1, 2)
        video = ((video.float() + 1) / 2).clamp(0, 1).cpu()  # (B, F, 3, H, W)
        if output_type == "pt":
            return video
        arr = video.permute(0, 1, 3, 4, 2).numpy()
        if output_type == "np":
            return arr
        return [[PIL.Image.fromarray(np.round(f * 255).astype(np.uint8)) for f in clip] for clip in arr]
