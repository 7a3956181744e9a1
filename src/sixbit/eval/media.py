"""Write videos for people to look at: an MP4 (H.264 via the optional ``imageio-ffmpeg``; an
animated GIF through Pillow where no encoder is installed) and a PNG contact sheet.

Frames are upscaled with nearest-neighbour so tiny 32 x 32 videos stay crisp (no invented
detail); ``scale`` trades file size for viewing size.

Example:
    >>> import numpy as np
    >>> frames = np.zeros((8, 32, 32, 3))
    >>> path = write_video(frames, "/tmp/clip.mp4")          # .gif if no encoder is available
    >>> sheet = write_contact_sheet(frames, "/tmp/clip.png")
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import PIL.Image

logger = logging.getLogger(__name__)


def to_uint8(frames, scale: int = 1) -> np.ndarray:
    """(F, H, W, 3) in [0, 1] (or uint8) -> uint8 (F, H*scale, W*scale, 3), nearest-neighbour."""
    from .shapes import as_frames

    arr = np.round(as_frames(frames) * 255).astype(np.uint8)
    if scale > 1:
        arr = arr.repeat(scale, axis=1).repeat(scale, axis=2)
    return arr


def mp4_available() -> bool:
    """Whether an MP4 encoder (the ``imageio-ffmpeg`` package's bundled ffmpeg) is importable."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # noqa: BLE001 - any failure means "no encoder", and we fall back to GIF
        return False
    return True


def write_video(frames, path, fps: int = 8, scale: int = 8) -> Path:
    """Write ``frames`` as MP4 at ``path``; without an encoder, as GIF next to it (suffix .gif).

    Args:
        frames: (F, H, W, 3) in [0, 1] or uint8 (see :func:`sixbit.eval.shapes.as_frames`).
        path: target file; its suffix is replaced by ``.mp4`` or ``.gif``.
        fps (int, default 8): playback rate; the shapes world's 8 frames last one second.
        scale (int, default 8): nearest-neighbour upscale (32 px -> 256 px, a multiple of 16 as
            H.264 wants).
    Returns the path actually written.
    """
    arr = to_uint8(frames, scale)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mp4_available():
        import imageio_ffmpeg

        out = path.with_suffix(".mp4")
        h, w = arr.shape[1:3]
        writer = imageio_ffmpeg.write_frames(
            str(out), (w, h), fps=fps, codec="libx264", pix_fmt_out="yuv420p", quality=8,
            macro_block_size=16, output_params=["-loglevel", "error"],
        )
        writer.send(None)
        for frame in arr:
            writer.send(np.ascontiguousarray(frame).tobytes())
        writer.close()
        return out
    logger.info("imageio-ffmpeg is not installed; writing a GIF instead of an MP4")
    out = path.with_suffix(".gif")
    images = [PIL.Image.fromarray(f) for f in arr]
    images[0].save(out, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return out


def write_contact_sheet(frames, path, scale: int = 4, gap: int = 2) -> Path:
    """All frames side by side in one PNG (``scale``x upscaled, ``gap`` px white between)."""
    arr = to_uint8(frames, scale)
    f, h, w, _ = arr.shape
    sheet = np.full((h, f * w + (f - 1) * gap, 3), 255, dtype=np.uint8)
    for i, frame in enumerate(arr):
        sheet[:, i * (w + gap): i * (w + gap) + w] = frame
    path = Path(path).with_suffix(".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    PIL.Image.fromarray(sheet).save(path)
    return path
