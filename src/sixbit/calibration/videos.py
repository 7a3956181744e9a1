"""Calibration from real videos: a folder of video files or of frame folders.

Activation statistics should come from the states the transformer sees while sampling. For a
folder of videos, each video is encoded (with the pipeline's VAE when it has one), and the
pipeline then runs its normal sampling loop with the latents replaced after every step by the
*forward-noised* video at the next timestep — the states training produced for that video.
The transformer, its hooks, CFG branches and step tracking run exactly as in a generation.

Accepted folder contents: video files (``.mp4 .mov .avi .webm .mkv`` through imageio-ffmpeg,
``.gif`` through Pillow) and sub-folders of frames (``.png .jpg .jpeg .bmp``, sorted by name).
A caption for ``clip.mp4`` (or folder ``clip/``) is read from ``clip.txt`` beside it; without
one the video calibrates with the empty prompt.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Callable

import numpy as np
import PIL.Image
import PIL.ImageSequence
import torch

from ..models import registered, spec_for

logger = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".mov", ".avi", ".webm", ".mkv")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


@dataclasses.dataclass
class CalibrationVideo:
    name: str
    frames: np.ndarray  # (F, H, W, 3) float32 in [0, 1]
    caption: str


def _read_file(path: Path) -> np.ndarray:
    if path.suffix.lower() == ".gif":
        with PIL.Image.open(path) as im:
            frames = [np.asarray(f.convert("RGB")) for f in PIL.ImageSequence.Iterator(im)]
    else:
        import imageio_ffmpeg

        reader = imageio_ffmpeg.read_frames(str(path))
        meta = next(reader)
        w, h = meta["size"]
        frames = [np.frombuffer(b, np.uint8).reshape(h, w, 3) for b in reader]
    return np.stack(frames).astype(np.float32) / 255.0


def _read_frames(folder: Path) -> np.ndarray:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
    frames = []
    for f in files:
        with PIL.Image.open(f) as im:
            frames.append(np.asarray(im.convert("RGB")))
    if len({fr.shape for fr in frames}) > 1:
        raise ValueError(f"frames in {str(folder)!r} differ in size: resize them to one size")
    return np.stack(frames).astype(np.float32) / 255.0


def read_videos(folder: str | Path) -> list[CalibrationVideo]:
    """Every video in ``folder`` (see the module docstring), with its caption."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"calibration folder {str(folder)!r} does not exist or is not a folder")
    entries = sorted(folder.iterdir())
    sources = [p for p in entries if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES + (".gif",)]
    sources += [p for p in entries if p.is_dir() and any(q.suffix.lower() in FRAME_SUFFIXES for q in p.iterdir())]
    if not sources and any(p.suffix.lower() in FRAME_SUFFIXES for p in entries):
        sources = [folder]  # the folder itself holds the frames of one video
    if not sources:
        raise ValueError(
            f"no videos in {str(folder)!r}: expected video files ({', '.join(VIDEO_SUFFIXES)}, .gif) "
            f"or folders of frames ({', '.join(FRAME_SUFFIXES)})"
        )
    videos = []
    for src in sources:
        try:
            frames = _read_frames(src) if src.is_dir() else _read_file(src)
        except (OSError, RuntimeError, StopIteration, ValueError) as e:
            raise ValueError(f"cannot read calibration video {str(src)!r}: {e}") from None
        caption_file = src.with_suffix(".txt") if src != folder else folder / "caption.txt"
        caption = caption_file.read_text().strip() if caption_file.is_file() else ""
        videos.append(CalibrationVideo(src.stem if src != folder else folder.name, frames, caption))
    return videos


def _layout_and_encode(pipe) -> tuple[str, Callable[[object, torch.Tensor], torch.Tensor]]:
    """How ``pipe``'s transformer lays out video latents and how its VAE makes them (from the
    model spec, :mod:`sixbit.models`): ``(layout, encode(pipe, pixels))``. A pipeline without a
    VAE samples in pixel space."""
    transformer = getattr(pipe, "transformer", None)
    spec = spec_for(transformer) if isinstance(transformer, torch.nn.Module) else None
    vae = getattr(pipe, "vae", None)
    if spec is None or spec.latent_layout is None or (vae is not None and spec.encode_video is None):
        known = sorted(c for s in registered().values() if s.latent_layout and s.encode_video for c in s.classes)
        raise ValueError(
            f"calibration from a video folder supports pipelines whose transformer is one of {known}, not "
            f"{type(pipe).__name__}; pass calibration_data as a list of prompts or as a callable that runs "
            "generations instead"
        )
    if vae is None:
        return spec.latent_layout, lambda p, video: video
    return spec.latent_layout, lambda p, video: spec.encode_video(p.vae, video)


def _size_kwargs(size):
    f, h, w = size
    return {"num_frames": f, "height": h, "width": w}


def _resize(frames: np.ndarray, size: tuple[int, int, int]) -> np.ndarray:
    f, h, w = size
    if len(frames) < f:
        raise ValueError(f"a calibration video has {len(frames)} frames; this pipeline needs at least {f}")
    idx = np.linspace(0, len(frames) - 1, f).round().astype(int)
    out = []
    for fr in frames[idx]:
        img = PIL.Image.fromarray(np.round(fr * 255).astype(np.uint8)).resize((w, h), PIL.Image.BILINEAR)
        out.append(np.asarray(img, dtype=np.float32) / 255.0)
    return np.stack(out)


def _noised(scheduler, x0: torch.Tensor, noise: torch.Tensor, index: int, timestep) -> torch.Tensor:
    """The forward-noised ``x0`` at the scheduler's ``index``-th step (flow matching or DDPM family)."""
    if hasattr(scheduler, "alphas_cumprod"):
        a = scheduler.alphas_cumprod[int(timestep)].to(x0.dtype)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise
    sigma = scheduler.sigmas[index].to(x0.dtype)
    return (1 - sigma) * x0 + sigma * noise


def video_runner(pipe, videos: list[CalibrationVideo], seed: int = 0, **call_kwargs) -> Callable[[], None]:
    """A ``run()`` for :func:`sixbit.calibrate` / DMPQ fitting that samples along ``videos``' noising paths.

    Checks the pipeline and every video up front, so a bad folder fails before any conversion."""
    layout, encode = _layout_and_encode(pipe)
    fixed = getattr(pipe, "video_size", None)  # a pipeline that makes one size declares it (frames, height, width)
    prepared = []
    for v in videos:
        size = fixed or tuple(v.frames.shape[:3])
        frames = _resize(v.frames, size)
        prepared.append((v, size, torch.from_numpy(frames).permute(3, 0, 1, 2)[None] * 2 - 1))  # (1, 3, F, H, W)

    def run() -> None:
        device = pipe._execution_device
        dtype = pipe.transformer.dtype
        for k, (video, size, pixels) in enumerate(prepared):
            vae = getattr(pipe, "vae", None)
            with torch.no_grad():
                x0 = encode(pipe, pixels.to(device=device, dtype=vae.dtype if vae is not None else dtype))
            x0 = x0.to(dtype)
            if layout == "BFCHW":
                x0 = x0.transpose(1, 2)
            noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed + k)).to(device, dtype)

            def replace(p, i, t, kwargs, x0=x0, noise=noise):
                timesteps = p.scheduler.timesteps
                if i + 1 >= len(timesteps):
                    return {}
                return {"latents": _noised(p.scheduler, x0, noise, i + 1, timesteps[i + 1])}

            logger.debug("calibrating on video %r (%s)", video.name, video.caption or "empty prompt")
            pipe(
                video.caption, latents=noise, callback_on_step_end=replace,
                callback_on_step_end_tensor_inputs=["latents"], **({} if fixed else _size_kwargs(size)), **call_kwargs,
            )

    return run
