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
