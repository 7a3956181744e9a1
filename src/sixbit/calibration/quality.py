"""What a PSNR target is checked against (``sixbit.tune(min_psnr=...)``, the delta cache's
``min_psnr``): the per-video PSNRs of a calibration run's videos against a reference run's, their
mean and its lower confidence bound.
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: PSNR of a video identical to its reference, for arithmetic (means and bounds).
PSNR_CAP = 100.0


def as_videos(result) -> torch.Tensor:
    """The videos a calibration run returned, as one fp32 tensor ``(N, F, H, W, C)``.

    Accepts a pipeline output (``.frames``), an array or tensor ``(N, F, H, W, C)`` or
    ``(F, H, W, C)``, or a list of those (one per batch)."""
    if hasattr(result, "frames"):
        result = result.frames
    if isinstance(result, (list, tuple)):
        if not result:
            raise ValueError("the calibration run returned no videos")
        parts = [as_videos(r) for r in result]
        shapes = {tuple(p.shape[1:]) for p in parts}
        if len(shapes) > 1:
            raise ValueError(f"the calibration videos differ in shape: {sorted(shapes)}")
        return torch.cat(parts)
    try:
        video = torch.as_tensor(np.asarray(result) if not isinstance(result, torch.Tensor) else result).float()
    except (TypeError, ValueError, RuntimeError):
        raise ValueError("a PSNR target compares generated videos: the calibration run must return them (a pipeline "
                         f"output, arrays or tensors (N, F, H, W, C)), got {type(result).__name__}") from None
    if video.dim() == 4:
        video = video.unsqueeze(0)
    if video.dim() != 5:
        raise ValueError(f"expected videos shaped (N, F, H, W, C) or (F, H, W, C), got {tuple(video.shape)}")
    return video


def video_mse(result, reference: torch.Tensor, what: str) -> torch.Tensor:
    """Per-video MSE of a calibration run's videos (``result``, as :func:`as_videos` reads it)
    against ``reference`` (the same run's :func:`as_videos` in full precision). ``what`` names
    what produced ``result`` in the errors."""
    videos = as_videos(result)
    if videos.shape != reference.shape:
        raise ValueError(f"the calibration run returned videos shaped {tuple(videos.shape)}, then "
                         f"{tuple(reference.shape)}: every run must generate the same videos")
    if not bool(torch.isfinite(videos).all()):
        raise ValueError(f"{what} produced NaN or Inf pixels: check the model in full precision first")
    return (videos - reference).double().pow(2).flatten(1).mean(1)


def video_psnrs(mse: torch.Tensor) -> np.ndarray:
    """Each video's PSNR (dB, pixels in [0, 1]) from its MSE, capped at :data:`PSNR_CAP`."""
    return np.array([PSNR_CAP if m <= 10 ** (-PSNR_CAP / 10) else -10 * math.log10(m) for m in mse.tolist()])


def psnr_of(mse: torch.Tensor) -> float:
    """Mean over videos of each video's PSNR (dB, pixels in [0, 1]); capped at :data:`PSNR_CAP`."""
    return float(np.mean(video_psnrs(mse)))


def psnr_bound(mse: torch.Tensor) -> float:
    """The lower confidence bound of :func:`psnr_of`: the mean per-video PSNR minus one standard
    error (the per-video PSNRs' sample SD / √n); with one video, the mean (no margin).

    What a ``min_psnr`` target is checked against: per-video PSNR spreads widely (22 to 41.5 dB
    for one w4a8 conversion of shapes-cogvideox, SD ≈ 4.5 dB), so a mean over a few calibration
    videos that just reaches the target is as likely as not to miss it on other prompts; the
    margin shrinks as calibration videos are added."""
    psnrs = video_psnrs(mse)
    if len(psnrs) < 2:
        return float(np.mean(psnrs))
    return float(np.mean(psnrs) - np.std(psnrs, ddof=1) / math.sqrt(len(psnrs)))


__all__ = ["PSNR_CAP", "as_videos", "psnr_bound", "psnr_of", "video_mse", "video_psnrs"]
