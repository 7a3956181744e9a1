"""Text-to-video pipeline for the tiny pixel-space CogVideoX of the shapes zoo."""

from __future__ import annotations

from typing import Callable

import torch
from diffusers import CogVideoXTransformer3DModel, FlowMatchEulerDiscreteScheduler

from .models import cogvideox_rotary_emb
from .pipeline_common import ShapesPipelineBase, ShapesPipelineOutput
from .text_encoder import ShapesTextEncoder
from .world import HEIGHT, WIDTH


class ShapesCogVideoXPipeline(ShapesPipelineBase):
    """Generate 8 x 32 x 32 RGB videos from prompts such as ``"a red circle moving right"``
    (longer ones with ``num_frames``: up to 128 frames; its rotary embedding stops at 32 x 32).

    Classifier-free guidance runs both branches in **one** transformer call (batch of
    ``[uncond, cond]``) inside ``transformer.cache_context("cond_uncond")``, as diffusers'
    CogVideoX pipeline does.

    Example:
        >>> from sixbit.zoo.shapes import load_pipeline
        >>> pipe = load_pipeline("cogvideox")
        >>> video = pipe("a red circle moving right", generator=torch.Generator().manual_seed(0)).frames[0]
        >>> video.shape
        (8, 32, 32, 3)
    """

    max_video_size = (128, HEIGHT, WIDTH)

    def __init__(
        self,
        text_encoder: ShapesTextEncoder,
        transformer: CogVideoXTransformer3DModel,
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
        """Args:
        prompt: one prompt or a list (words from the shapes vocabulary).
        num_inference_steps (int, default 20): Euler steps; fewer is faster and blurrier.
        guidance_scale (float, default 4.0): CFG scale; <= 1 disables guidance (one branch, half the cost).
        num_videos_per_prompt (int, default 1), generator, latents: noise control.
        num_frames, height, width (int, default: the trained 8, 32, 32): the video's size, in
            multiples of the transformer's (2, 4, 4) patch, up to ``max_video_size``; a size it
            was not trained on stresses the model (sixbit's length benchmarks use 4x the frames).
        output_type ("np" | "pil" | "pt", default "np"), return_dict (bool, default True).
        callback_on_step_end: ``f(pipe, step, timestep, {"latents": ...}) -> dict`` after each step.
        """
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
        text = torch.cat([uncond, cond]) if self.do_classifier_free_guidance else cond
        batch = cond.shape[0]
        latents = self.prepare_latents(batch, generator, device, dtype, "BFCHW", latents, size)
        rope = cogvideox_rotary_emb(self.transformer, latents.shape[1], latents.shape[3], latents.shape[4], device)

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
                model_in = torch.cat([latents, latents]) if self.do_classifier_free_guidance else latents
                # "cond_uncond" only when the batch really holds both branches (uncond first)
                branch = "cond_uncond" if self.do_classifier_free_guidance else "cond"
                with self.transformer.cache_context(branch, **step_info):
                    velocity = self.transformer(
                        hidden_states=model_in,
                        encoder_hidden_states=text,
                        timestep=t.expand(model_in.shape[0]),
                        image_rotary_emb=rope,
                        return_dict=False,
                    )[0]
                if self.do_classifier_free_guidance:
                    v_uncond, v_cond = velocity.chunk(2)
                    velocity = v_uncond + guidance_scale * (v_cond - v_uncond)
                latents = self.scheduler.step(velocity, t, latents, return_dict=False, **step_kwargs)[0]
                latents = self._run_callback(callback_on_step_end, tensor_inputs, i, t, latents)
                progress_bar.update()

        frames = self.postprocess(latents, "BFCHW", output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (frames,)
        return ShapesPipelineOutput(frames=frames)
