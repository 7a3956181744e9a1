"""Full-reference video metrics: PSNR and SSIM of a video against a reference video.

Videos are arrays or tensors of values in [0, 1] shaped ``(frames, H, W, C)`` or
``(videos, frames, H, W, C)`` (the layout of ``pipeline(...).frames``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def _as_tensor(video) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(video, dtype=np.float64) if not isinstance(video, torch.Tensor) else video)
    t = t.double()
    if t.dim() == 4:
        t = t.unsqueeze(0)
    if t.dim() != 5:
        raise ValueError(f"expected a video shaped (frames, H, W, C) or (videos, frames, H, W, C), got {tuple(t.shape)}")
    return t


def psnr(video, reference, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB over all pixels (``inf`` for identical videos)."""
    a, b = _as_tensor(video), _as_tensor(reference)
    if a.shape != b.shape:
        raise ValueError(f"videos differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    mse = float((a - b).pow(2).mean())
    return math.inf if mse == 0 else 10 * math.log10(data_range**2 / mse)


def _gaussian_window(size: int, sigma: float) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g)


def ssim(video, reference, data_range: float = 1.0, window: int = 7, sigma: float = 1.5) -> float:
    """Mean structural similarity (Wang et al. 2004) over frames and channels.

    Gaussian window (``window`` × ``window``, σ = ``sigma``; 7 rather than the usual 11 because
    the shapes videos are 32 × 32), constants ``K1 = 0.01``, ``K2 = 0.03``, valid region only.
    """
    a, b = _as_tensor(video), _as_tensor(reference)
    if a.shape != b.shape:
        raise ValueError(f"videos differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    n, f, h, w, c = a.shape
    if min(h, w) < window:
        raise ValueError(f"frames of {h}×{w} are smaller than the {window}×{window} SSIM window")
    x = a.permute(0, 1, 4, 2, 3).reshape(-1, 1, h, w)
    y = b.permute(0, 1, 4, 2, 3).reshape(-1, 1, h, w)
    k = _gaussian_window(window, sigma)[None, None]
    mu_x, mu_y = F.conv2d(x, k), F.conv2d(y, k)
    sxx = F.conv2d(x * x, k) - mu_x**2
    syy = F.conv2d(y * y, k) - mu_y**2
    sxy = F.conv2d(x * y, k) - mu_x * mu_y
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    return float(s.mean())


# ------------------------------------------------------------------------ calibration videos
# What a ``min_psnr`` target is checked against (``sixbit.tune``, the delta cache's calibration):
# the per-video PSNRs of a run's videos against a reference run's.

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
