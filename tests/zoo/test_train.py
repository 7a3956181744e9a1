"""The training script on a tiny budget: loss, determinism, bit-exact resume, loadable output."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sixbit.zoo.shapes import load_pipeline
from sixbit.zoo.shapes.train import flow_times, main, object_weights, training_batch
from sixbit.zoo.shapes.world import VideoSpec, render


def _weights(folder):
    return load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))


def _train(tmp_path, name, *extra):
    out = tmp_path / name
    main(["--arch", "wan", "--out", str(out), "--state", str(tmp_path / f"{name}.safetensors"),
          "--steps", "4", "--batch-size", "2", "--threads", "1", "--save-every", "100", "--log-every", "1",
          "--eval-pairs", "0", *extra])
    return out


def test_training_batch_is_deterministic_with_cfg_dropout():
    v1, c1 = training_batch(5, seed=0, batch_size=64, cfg_dropout=0.5)
    v2, c2 = training_batch(5, seed=0, batch_size=64, cfg_dropout=0.5)
    assert torch.equal(v1, v2) and c1 == c2
    assert v1.min() >= -1 and v1.max() <= 1
    assert 10 < c1.count("") < 54  # about half the captions dropped to the unconditional prompt
    assert any("background" in c for c in c1) and any(c and "background" not in c for c in c1)


def test_flow_times_uniform_and_logit_normal():
    u = flow_times(20_000, torch.Generator().manual_seed(0), "uniform")
    ln = flow_times(20_000, torch.Generator().manual_seed(0), "logit-normal")
    assert 0 < float(u.min()) and float(u.max()) < 1 and 0 < float(ln.min()) and float(ln.max()) < 1
    # logit-normal: symmetric about 1/2, its logit a standard normal, so far fewer times near the ends.
    logit = torch.log(ln / (1 - ln))
    assert abs(float(logit.mean())) < 0.03 and abs(float(logit.std()) - 1) < 0.03
    assert float((ln < 0.1).float().mean()) < 0.5 * float((u < 0.1).float().mean())
    # leaning toward noise (mean 1) nearly never trains t < 0.1; a uniform share of the batch does
    leaned = flow_times(20_000, torch.Generator().manual_seed(0), "logit-normal", mean=1.0)
    mixed = flow_times(20_000, torch.Generator().manual_seed(0), "logit-normal", mean=1.0, uniform_fraction=0.3)
    assert float(leaned.median()) > 0.7 and float((leaned < 0.1).float().mean()) < 0.01
    assert 0.025 < float((mixed < 0.1).float().mean()) < 0.04  # 0.3 * 0.1 + 0.7 * 0.007
    with pytest.raises(ValueError, match="logit-normal"):
        flow_times(4, torch.Generator(), "cosine")
    with pytest.raises(ValueError, match="uniform_fraction"):
        flow_times(4, torch.Generator(), "logit-normal", uniform_fraction=1.5)


def test_training_batch_draws_objects_in_the_size_range():
    small, _ = training_batch(3, seed=0, batch_size=32, cfg_dropout=0.0, size_range=(9.0, 9.0))
    large, _ = training_batch(3, seed=0, batch_size=32, cfg_dropout=0.0, size_range=(16.0, 16.0))
    # Saturation (object coverage) grows with the object's area: (16 / 9)^2 ~ 3.2x.
    def area(v):
        v = (v + 1) / 2
        return float((v.amax(dim=2) - v.amin(dim=2)).sum())
    assert 2.8 < area(large) / area(small) < 3.6


def test_object_weights_cover_the_object_and_two_pixels_around_it():
    spec = VideoSpec("blue", "square", "right", "textured", size=10.0, speed=2.0, x0=8.0, y0=16.0)
    video = render([spec]) * 2 - 1
    w = object_weights(video, 4.0)[0, 0, 0]  # frame 0: the square covers x, y in [3, 13) and [11, 21)
    assert w.shape == (32, 32) and set(w.unique().tolist()) == {1.0, 5.0}
    rows, cols = (w > 1).nonzero(as_tuple=True)
    assert (int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())) == (9, 22, 1, 14)
    assert bool((object_weights(video, 0.0) == 1).all())


def test_train_is_deterministic_resumable_and_loadable(tmp_path):
    a = _train(tmp_path, "a")
    b = _train(tmp_path, "b")
    _train(tmp_path, "c", "--stop-at", "2")
    c = _train(tmp_path, "c", "--resume")
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert all(v.dtype == torch.float16 for v in wa.values())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(torch.equal(wa[k], wc[k]) for k in wa)  # stop + resume == one run
    meta = json.loads((a / "training.json").read_text())
    assert meta["step"] == 4 and meta["arch"] == "wan"
    recipe = ("--size", "9", "12", "--jitter", "5", "--timesteps", "uniform", "--object-weight", "0")  # not the defaults
    d, e = _weights(_train(tmp_path, "d", *recipe)), _weights(_train(tmp_path, "e", *recipe))
    assert all(torch.equal(d[k], e[k]) for k in d)
    assert not all(torch.equal(wa[k], d[k]) for k in wa)
    assert json.loads((tmp_path / "d" / "training.json").read_text())["object_weight"] == 0
    pipe = load_pipeline("wan", path=a)
    assert pipe.transformer.dtype == torch.float32
    frames = pipe("a red circle moving right", num_inference_steps=2).frames
    assert frames.shape == (1, 8, 32, 32, 3) and np.isfinite(frames).all()


def test_eval_pairs_records_an_adherence_curve(tmp_path):
    out = _train(tmp_path, "a", "--steps", "2", "--save-every", "1", "--eval-pairs", "2")
    curve = json.loads((out / "training.json").read_text())["adherence"]
    assert [p["step"] for p in curve] == [1, 2]
    assert set(curve[0]) == {"step", "color", "shape", "direction", "all", "flicker"}
    assert all(0 <= p[k] <= 1 for p in curve for k in ("color", "shape", "direction", "all"))
    # a resumed run keeps the points up to where it resumed
    stopped = json.loads((_train(tmp_path, "b", "--steps", "2", "--save-every", "1", "--eval-pairs", "1",
                                 "--stop-at", "1") / "training.json").read_text())
    resumed = json.loads((_train(tmp_path, "b", "--steps", "2", "--save-every", "1", "--eval-pairs", "1",
                                 "--resume") / "training.json").read_text())
    assert [p["step"] for p in resumed["adherence"]] == [1, 2]
    # the training time is summed over the resumed runs
    assert 0 < stopped["training_seconds"] < resumed["training_seconds"]
