"""Video and contact-sheet writers (MP4 via imageio-ffmpeg, GIF fallback)."""

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
