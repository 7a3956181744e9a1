"""Video and contact-sheet writers (MP4 via imageio-ffmpeg, GIF fallback)."""

import os
import stat
import sys

import numpy as np
import PIL.Image
import pytest

from sixbit.eval import media


def _frames():
    rng = np.random.default_rng(0)
    return rng.random((8, 32, 32, 3))


def test_contact_sheet_has_every_frame(tmp_path):
    frames = _frames()
    path = media.write_contact_sheet(frames, tmp_path / "sheet", scale=2, gap=3)
    img = np.asarray(PIL.Image.open(path))
    assert path.suffix == ".png" and img.shape == (64, 8 * 64 + 7 * 3, 3)
    np.testing.assert_array_equal(img[:2, 67:69], np.round(frames[1, :1, :1] * 255).astype(np.uint8).repeat(2, 0).repeat(2, 1))


def test_gif_fallback_without_encoder(tmp_path, monkeypatch):
    monkeypatch.setattr(media, "mp4_available", lambda: False)
    path = media.write_video(_frames(), tmp_path / "clip.mp4", scale=4)
    assert path.suffix == ".gif"
    with PIL.Image.open(path) as gif:
        assert gif.n_frames == 8 and gif.size == (128, 128)


@pytest.mark.skipif(not media.mp4_available(), reason="imageio-ffmpeg not installed")
def test_mp4_is_written(tmp_path):
    path = media.write_video(_frames(), tmp_path / "clip.gif")
    assert path.suffix == ".mp4"
    data = path.read_bytes()
    assert len(data) > 1000 and data[4:8] == b"ftyp"


# ---- issue 22: a failed write is an error, never a success ---------------------------------------------------

needs_ffmpeg = pytest.mark.skipif(not media.mp4_available(), reason="imageio-ffmpeg not installed")


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("encoder", [True, False])
def test_a_folder_as_target_is_refused(encoder, tmp_path, monkeypatch):
    if not encoder:
        monkeypatch.setattr(media, "mp4_available", lambda: False)
    target = tmp_path / ("clip.mp4" if encoder else "clip.gif")
    target.mkdir()
    with pytest.raises(ValueError) as err:
        media.write_video(_frames(), target)
    msg = _one_line(err)
    assert str(target) in msg and "is a folder" in msg and "give a file path" in msg


def test_a_file_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "taken").write_text("x")
    with pytest.raises(ValueError) as err:
        media.write_video(_frames(), tmp_path / "taken" / "clip.mp4")
    assert "is a file, not a folder" in _one_line(err)
    with pytest.raises(ValueError, match="is a file, not a folder"):
        media.write_contact_sheet(_frames(), tmp_path / "taken" / "sheet.png")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs POSIX permissions and a non-root user")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(ValueError) as err:
            media.write_video(_frames(), folder / "clip.mp4")
        assert "not writable" in _one_line(err) and str(folder) in str(err.value)
    finally:
        folder.chmod(stat.S_IRWXU)


def test_unwritable_folder_is_refused_even_for_root(tmp_path, monkeypatch):
    """os.access is what says "not writable" (root passes chmod checks, so the answer is stubbed)."""
    monkeypatch.setattr(media.os, "access", lambda path, mode: False)
    with pytest.raises(ValueError) as err:
        media.check_writable(tmp_path / "clip.mp4")
    assert "not writable" in _one_line(err)


@needs_ffmpeg
def test_ffmpeg_failure_is_an_error_with_its_last_line_only(tmp_path):
    target = tmp_path / "clip.mp4"
    target.mkdir()  # past the up-front check: ffmpeg itself fails to open it
    with pytest.raises(ValueError) as err:
        media._write_mp4(media.to_uint8(_frames(), 8), target, 8)
    msg = _one_line(err)
    assert str(target) in msg and "ffmpeg failed" in msg and "directory" in msg.lower()
    assert "ffmpeg version" not in msg and "FFMPEG COMMAND" not in msg


BANNER = """ffmpeg version 7.0.2-static https://johnvanSickle.com/ffmpeg/  Copyright (c) 2000-2024 the FFmpeg developers
  built with gcc 8 (Debian 8.3.0-6)
  configuration: --enable-gpl --enable-version3 --enable-static --disable-debug --enable-libx264
  libavutil      59.  8.100 / 59.  8.100
  libavcodec     61.  3.100 / 61.  3.100
Input #0, rawvideo, from 'fd:':
  Duration: N/A, start: 0.000000, bitrate: 12582 kb/s
  Stream #0:0: Video: rawvideo (RGB[24] / 0x18424752), rgb24, 256x256, 8 fps
[out#0/mp4 @ 0x5581d2c0] Error opening output out.mp4: Permission denied
Error opening output file out.mp4.
Error opening output files: Permission denied
Conversion failed!
"""


def test_last_meaningful_line_drops_the_banner():
    assert media.last_meaningful_line(BANNER) == "Error opening output files: Permission denied"
    assert media.last_meaningful_line("[out#0/mp4 @ 0x5581d2c0] Error opening output x: No space left\n") == \
        "Error opening output x: No space left"
    assert media.last_meaningful_line(BANNER.split("[out")[0]) == ""


def _fake_ffmpeg(tmp_path, monkeypatch, body: str):
    import imageio_ffmpeg

    script = tmp_path / "fake-ffmpeg"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdin.buffer.read()\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setattr(media, "mp4_available", lambda: True)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(script))


@pytest.mark.skipif(os.name != "posix", reason="a fake ffmpeg as a script")
def test_ffmpeg_banner_stays_out_of_the_one_line_error(tmp_path, monkeypatch):
    pytest.importorskip("imageio_ffmpeg")
    _fake_ffmpeg(tmp_path, monkeypatch, f"sys.stderr.write({BANNER!r})\nsys.exit(1)")
    with pytest.raises(ValueError) as err:
        media.write_video(_frames(), tmp_path / "out.mp4")
    msg = _one_line(err)
    assert "(Error opening output files: Permission denied)" in msg
    assert "configuration" not in msg and "ffmpeg version" not in msg and "libav" not in msg
    assert not (tmp_path / "out.mp4").exists()


@pytest.mark.skipif(os.name != "posix", reason="a fake ffmpeg as a script")
def test_ffmpeg_that_exits_0_without_a_file_is_an_error(tmp_path, monkeypatch):
    pytest.importorskip("imageio_ffmpeg")
    _fake_ffmpeg(tmp_path, monkeypatch, "sys.exit(0)")
    with pytest.raises(ValueError) as err:
        media.write_video(_frames(), tmp_path / "out.mp4")
    assert "exited without writing it" in _one_line(err)


@pytest.mark.skipif(os.name != "posix", reason="a fake ffmpeg as a script")
def test_ffmpeg_that_hangs_is_stopped_and_named(tmp_path, monkeypatch):
    """Issue 61: the encoder ran with no deadline; one that hangs is now stopped, the partial file
    removed, and the error names ffmpeg, the file and the time it had."""
    pytest.importorskip("imageio_ffmpeg")
    _fake_ffmpeg(tmp_path, monkeypatch, "open(sys.argv[-1].removeprefix('file:'), 'wb').close()\n"
                                        "import time\ntime.sleep(120)")
    monkeypatch.setattr(media, "FFMPEG_SECONDS", 1.0)
    with pytest.raises(ValueError) as err:
        media.write_video(_frames(), tmp_path / "out.mp4")
    msg = _one_line(err)
    assert str(tmp_path / "out.mp4") in msg and "ffmpeg" in msg and "did not finish within 2 s" in msg  # 1 s + 1.6 Mpx
    assert not (tmp_path / "out.mp4").exists()
