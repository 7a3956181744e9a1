"""Text-to-video pipeline for the tiny pixel-space Wan of the shapes zoo."""

from __future__ import annotations

from typing import Callable

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel

from .pipeline_common import ShapesPipelineBase, ShapesPipelineOutput
from .text_encoder import ShapesTextEncoder


class ShapesWanPipeline(ShapesPipelineBase):
    """Generate 8 x 32 x 32 RGB videos from prompts such as ``"a red circle moving right"``
    (longer and larger ones with ``num_frames``, ``height``, ``width``: up to 128 x 256 x 256).

    Classifier-free guidance calls the transformer once per branch, inside
    ``transformer.cache_context("cond")`` and ``cache_context("uncond")``, as diffusers' Wan
    pipeline does; caches and per-branch state therefore see two separate streams.

    Example:
        >>> from sixbit.zoo.shapes import load_pipeline
        >>> pipe = load_pipeline("wan")
        >>> video = pipe("a blue square moving up", generator=torch.Generator().manual_seed(0)).frames[0]
        >>> video.shape
        (8, 32, 32, 3)
    """

    max_video_size = (128, 256, 256)  # its rotary embedding's 64 positions per axis, in (2, 4, 4) patches

    def __init__(
        self,
        text_encoder: ShapesTextEncoder,
        transformer: WanTransformer3DModel,
        scheduler: FlowMatchEulerDiscreteScheduler,
    ):
        super().__init__()
        self.register_modules(text_encoder=text_encoder, transformer=transformer, scheduler=scheduler)

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str],
        num_inference_steps: int = 20,
        guidance_scale: float = 4.0,
        num_videos_per_prompt: int = 1,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        num_frames: int | None = None,
        height: int | None = None,
        width: int | None = None,
        output_type: str = "np",
        return_dict: bool = True,
        callback_on_step_end: Callable | None = None,
        callback_on_step_end_tensor_inputs: list[str] = ("latents",),
    ):
        """Args: as :meth:`ShapesCogVideoXPipeline.__call__`; guidance costs two transformer calls per step."""
        callback_on_step_end, tensor_inputs = self._normalize_callback(
            callback_on_step_end, list(callback_on_step_end_tensor_inputs)
        )
        prompts = self._check_inputs(prompt, num_inference_steps, guidance_scale, output_type, tensor_inputs)
        size = self.check_video_size(num_frames, height, width)
        self._guidance_scale = guidance_scale
        self._interrupt = False
        device = self._execution_device
        dtype = self.transformer.dtype

        cond, uncond = self.encode_prompt(prompts, num_videos_per_prompt)
        batch = cond.shape[0]
        latents = self.prepare_latents(batch, generator, device, dtype, "BCFHW", latents, size)

        self.scheduler.set_timesteps(num_inference_steps, device=device)
        step_kwargs = self._step_kwargs(generator)
        timesteps = self.scheduler.timesteps
        self._num_timesteps = len(timesteps)
        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    continue
                # Where the loop is, for step-aware hooks (diffusers' CacheContext fields).
                step_info = {
                    "step_index": i,
                    "sigma": float(self.scheduler.sigmas[i]),
                    "num_inference_steps": self._num_timesteps,
                }
                timestep = t.expand(batch)
                with self.transformer.cache_context("cond", **step_info):
                    velocity = self.transformer(
                        hidden_states=latents, timestep=timestep, encoder_hidden_states=cond, return_dict=False
                    )[0]
                if self.do_classifier_free_guidance:
                    with self.transformer.cache_context("uncond", **step_info):
                        v_uncond = self.transformer(
                            hidden_states=latents, timestep=timestep, encoder_hidden_states=uncond, return_dict=False
                        )[0]
                    velocity = v_uncond + guidance_scale * (velocity - v_uncond)
                latents = self.scheduler.step(velocity, t, latents, return_dict=False, **step_kwargs)[0]
                latents = self._run_callback(callback_on_step_end, tensor_inputs, i, t, latents)
                progress_bar.update()

        frames = self.postprocess(latents, "BCFHW", output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (frames,)
        return ShapesPipelineOutput(frames=frames)
