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
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import PIL.Image

logger = logging.getLogger(__name__)


def as_frames(video) -> np.ndarray:
    """Normalize a video to float64 (F, H, W, 3) in [0, 1].

    Accepts numpy or torch, (F, H, W, 3) or (F, 3, H, W), float in [0, 1] or uint8, or a list of
    PIL images."""
    if isinstance(video, (list, tuple)):
        video = np.stack([np.asarray(im.convert("RGB")) for im in video])
    if hasattr(video, "detach"):
        video = video.detach().float().cpu().numpy()
    arr = np.asarray(video)
    if arr.ndim != 4:
        raise ValueError(f"a video must have 4 dimensions (frames, H, W, 3) or (frames, 3, H, W); got {arr.shape}")
    if arr.shape[-1] != 3 and arr.shape[1] == 3:
        arr = arr.transpose(0, 2, 3, 1)
    if arr.shape[-1] != 3:
        raise ValueError(f"a video must have 3 color channels; got shape {arr.shape}")
    if arr.dtype == np.uint8:
        return arr.astype(np.float64) / 255.0
    return np.clip(arr.astype(np.float64), 0.0, 1.0)


def to_uint8(frames, scale: int = 1) -> np.ndarray:
    """(F, H, W, 3) in [0, 1] (or uint8) -> uint8 (F, H*scale, W*scale, 3), nearest-neighbour."""
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


def video_path(path) -> Path:
    """The file :func:`write_video` writes for ``path``: its suffix becomes ``.mp4`` (``.gif`` without an encoder)."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise ValueError(f"cannot write {str(path)!r}: it names no file; give a file path such as 'video.mp4'")
    return path.with_suffix(".mp4" if mp4_available() else ".gif")


def check_writable(path, create: bool = True) -> Path:
    """Refuse a file that cannot be written at ``path``; with ``create``, make its missing folders.

    Without ``create`` nothing is changed: missing folders pass when they could be made (the
    nearest existing one is writable), so a command can check its output before any work.
    Raises ``ValueError`` naming the path and the cause: ``path`` is a folder, a file stands
    where a folder should be, or the folder is not writable.
    """
    path = Path(path)
    if path.is_dir():
        example = str(path / ("out" + (path.suffix or ".mp4")))
        raise ValueError(f"cannot write {str(path)!r}: it is a folder; give a file path such as {example!r}")
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir():
        raise ValueError(f"cannot write {str(path)!r}: {str(folder)!r} is a file, not a folder; choose another path")
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot write {str(path)!r}: its folder {str(path.parent)!r} cannot be created "
                             f"({e.strerror or e}); choose a folder you can write to") from None
        folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write {str(path)!r}: the folder {str(folder)!r} is not writable; "
                         "choose a folder you can write to")
    return path


# What ffmpeg prints besides the error itself: the banner (version, build, configuration, library
# versions), stream descriptions, progress, and its generic closing lines.
_FFMPEG_NOISE = re.compile(
    r"^(ffmpeg version|built with|configuration:|lib[a-z0-9]+\s+\d|Input #|Output #|Stream #|Stream mapping|"
    r"Duration:|Metadata:|encoder\s*:|Press \[q\]|frame=|size=|video:|Conversion failed!?$|Exiting normally)",
    re.IGNORECASE,
)


def last_meaningful_line(stderr: str) -> str:
    """The last line of a tool's stderr that says what went wrong (banner, progress and ``[tag @ 0x…]`` removed)."""
    for line in reversed(stderr.splitlines()):
        line = line.strip()
        if not line or _FFMPEG_NOISE.match(line):
            continue
        line = re.sub(r"^\[[^\]]*@\s*0x[0-9a-fA-F]+\]\s*", "", line)
        return line[:200]
    return ""


#: The encoder's deadline: this many seconds, plus one per :data:`FFMPEG_PIXELS_PER_SECOND` pixels
#: of video (libx264 encodes tens of millions a second on one core): past it ffmpeg is stopped.
FFMPEG_SECONDS = 60.0
FFMPEG_PIXELS_PER_SECOND = 1e6


def _write_mp4(arr: np.ndarray, out: Path, fps: int) -> None:
    """H.264 through the ffmpeg of ``imageio-ffmpeg``; raises ``ValueError`` unless a non-empty
    file is written in time (:data:`FFMPEG_SECONDS`)."""
    import imageio_ffmpeg

    h, w = arr.shape[1:3]
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
           "-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{w}x{h}", "-pix_fmt", "rgb24", "-r", str(fps), "-i", "-",
           "-an", "-vcodec", "libx264", "-pix_fmt", "yuv420p", "-crf", "10"]
    if w % 16 or h % 16:  # H.264 players want multiples of 16
        cmd += ["-vf", f"scale={-(-w // 16) * 16}:{-(-h // 16) * 16}:flags=neighbor"]
    cmd.append("file:" + str(out))  # "file:": a name like "a:b.mp4" is never read as a protocol
    deadline = FFMPEG_SECONDS + arr.size / 3 / FFMPEG_PIXELS_PER_SECOND
    try:
        proc = subprocess.run(cmd, input=np.ascontiguousarray(arr).tobytes(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, check=False, timeout=deadline)
    except subprocess.TimeoutExpired:  # run() has killed it
        out.unlink(missing_ok=True)
        raise ValueError(f"cannot write the video {str(out)!r}: ffmpeg ({cmd[0]}) did not finish within "
                         f"{deadline:.0f} s and was stopped; check that it runs (`{cmd[0]} -version`) and that "
                         "the machine is not overloaded, then try again") from None
    if proc.returncode != 0:
        if out.is_file() and out.stat().st_size == 0:
            out.unlink()
        cause = last_meaningful_line(proc.stderr.decode(errors="replace")) or f"exit code {proc.returncode}"
        raise ValueError(f"cannot write the video {str(out)!r}: ffmpeg failed ({cause}); "
                         "check that the folder is writable and the disk not full")
    if not out.is_file() or out.stat().st_size == 0:
        raise ValueError(f"cannot write the video {str(out)!r}: ffmpeg exited without writing it; "
                         "check that the folder is writable and the disk not full")


def write_video(frames, path, fps: int = 8, scale: int = 8) -> Path:
    """Write ``frames`` as MP4 at ``path``; without an encoder, as GIF next to it (suffix .gif).

    Args:
        frames: (F, H, W, 3) in [0, 1] or uint8 (see :func:`as_frames`).
        path: target file; its suffix is replaced by ``.mp4`` or ``.gif`` (:func:`video_path`);
            missing folders are created.
        fps (int, default 8): playback rate; the shapes world's 8 frames last one second.
        scale (int, default 8): nearest-neighbour upscale (32 px -> 256 px, a multiple of 16 as
            H.264 wants).
    Returns the path actually written.

    Raises:
        ValueError: the file cannot be written (the path is a folder, the folder is not
            writable, the encoder failed): one line naming the path and the cause.
    """
    out = check_writable(video_path(path))
    arr = to_uint8(frames, scale)
    if out.suffix == ".mp4":
        _write_mp4(arr, out, fps)
        return out
    logger.info("imageio-ffmpeg is not installed; writing a GIF instead of an MP4")
    images = [PIL.Image.fromarray(f) for f in arr]
    try:
        images[0].save(out, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    except OSError as e:
        raise ValueError(f"cannot write the video {str(out)!r}: {e.strerror or e}; "
                         "check that the folder is writable and the disk not full") from None
    return out


def write_contact_sheet(frames, path, scale: int = 4, gap: int = 2) -> Path:
    """All frames side by side in one PNG (``scale``x upscaled, ``gap`` px white between)."""
    arr = to_uint8(frames, scale)
    f, h, w, _ = arr.shape
    sheet = np.full((h, f * w + (f - 1) * gap, 3), 255, dtype=np.uint8)
    for i, frame in enumerate(arr):
        sheet[:, i * (w + gap): i * (w + gap) + w] = frame
    path = check_writable(Path(path).with_suffix(".png"))
    try:
        PIL.Image.fromarray(sheet).save(path)
    except OSError as e:
        raise ValueError(f"cannot write the contact sheet {str(path)!r}: {e.strerror or e}; "
                         "check that the folder is writable and the disk not full") from None
    return path
