"""The bench harness end to end on the shipped shapes-wan pipeline: 1 prompt, 2 steps."""

import csv
import json

import pytest

from sixbit.bench.harness import BenchSettings, run_bench
from sixbit.bench.outputs import write_all


@pytest.fixture(scope="module")
def result():
    settings = BenchSettings("shapes-wan", ["tdc-0.5", "w4a8", "fbcache-0.5"], prompts=1, steps=2,
                             calibration_prompts=1, video_prompts=1)
    return run_bench(settings, progress=False)


def test_rows_measure_every_method(result):
    assert [r["method"] for r in result.rows] == ["fp", "tdc-0.5", "w4a8", "fbcache-0.5"]
    by = {r["method"]: r for r in result.rows}
    for r in result.rows:
        assert r["status"] == "ok", r["note"]
        assert len(r["run_seconds"]) >= 3
        assert r["weight_bytes"] > 0 and r["s_per_video"] > 0
        assert set(r["projection"]) == {"as run", "Wan2.1-14B"}
    fp, w4a8 = by["fp"], by["w4a8"]
    assert len(fp["run_seconds"]) == 6  # timed before and after the others
    assert fp["speedup"] == 1.0
    assert all(r["fp_probe_before"] > 0 and r["speedup"] > 0 for r in result.rows[1:])  # FP probed next to each
    assert fp["psnr"] == float("inf") and fp["act_bits"] == 16.0 and fp["skip_share"] == 0.0
    assert fp["projection"]["as run"]["B200"] == pytest.approx(1.0)
    # NVFP4 weights: far fewer bytes; INT8 activations on the quantized linears
    assert w4a8["weight_bytes"] < 0.5 * fp["weight_bytes"]
    assert 8.0 <= w4a8["act_bits"] < 9.0 and w4a8["psnr"] < 60
    assert w4a8["work"]["gemm_flops"]["int8"] > 0
    # the GEMM work is the same, only its precision moved
    assert sum(w4a8["work"]["gemm_flops"].values()) == pytest.approx(sum(fp["work"]["gemm_flops"].values()))
    assert w4a8["work"]["attention_flops"] == pytest.approx(fp["work"]["attention_flops"])


def test_writes_every_output(result, tmp_path):
    paths = write_all(result, tmp_path)
    md = (tmp_path / "results.md").read_text()
    assert "PROJECTION" in md and "| w4a8 |" in md and "speedup_vs_psnr.png" in md
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["method"] for r in data["rows"]] == ["fp", "tdc-0.5", "w4a8", "fbcache-0.5"]
    assert data["rows"][0]["psnr"] == "inf"  # JSON-safe
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert (tmp_path / "speedup_vs_psnr.png").stat().st_size > 0
    assert (tmp_path / "precision_w4a8.png").is_file()
    page = (tmp_path / "index.html").read_text()
    assert "w4a8" in page and "videos/" in page
    assert len(list((tmp_path / "videos").iterdir())) == 4
    assert paths["html"] == tmp_path / "index.html"
