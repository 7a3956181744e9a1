"""The bench harness end to end on the shipped shapes-wan pipeline: 1 prompt, 2 steps."""

import csv
import json

import pytest

from sixbit.bench.harness import BenchSettings, run_bench
from sixbit.bench.outputs import write_all


@pytest.fixture(scope="module")
def result():
    settings = BenchSettings("shapes-wan", ["tdc-0.5", "w4a8", "fbcache-0.5"], prompts=1, steps=2,
                             calibration_prompts=1, video_prompts=1, baseline="bf16")
    return run_bench(settings, progress=False)


def test_rows_measure_every_method(result):
    assert [r["method"] for r in result.rows] == ["fp", "bf16", "tdc-0.5", "w4a8", "fbcache-0.5"]
    by = {r["method"]: r for r in result.rows}
    for r in result.rows:
        assert r["status"] == "ok", r["note"]
        assert len(r["run_seconds"]) >= 3
        assert r["weight_bytes"] > 0 and r["s_per_video"] > 0
        assert set(r["projection"]) == {"as run", "Wan2.1-14B"}
    fp, bf16, w4a8 = by["fp"], by["bf16"], by["w4a8"]
    assert len(fp["run_seconds"]) == len(bf16["run_seconds"]) == 6  # the references: timed before and after the others
    # speedups against bf16 (the baseline), fp32 a column; both references probed right before each later method
    assert bf16["speedup"] == 1.0 and fp["speedup_fp32"] == 1.0
    assert fp["speedup"] == pytest.approx(1 / bf16["speedup_fp32"])
    assert set(bf16["probes_before"]) == {"fp"}
    for r in result.rows[2:]:
        assert set(r["probes_before"]) == {"fp", "bf16"} and min(r["probes_before"].values()) > 0
        assert r["speedup"] == pytest.approx(r["s_per_video_nearby"]["bf16"] / r["s_per_video"])
        assert r["speedup_fp32"] == pytest.approx(r["s_per_video_nearby"]["fp"] / r["s_per_video"])
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
    assert "| method | s/video | × bf16 | × fp32 |" in md  # every speedup names its baseline dtype
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["method"] for r in data["rows"]] == ["fp", "bf16", "tdc-0.5", "w4a8", "fbcache-0.5"]
    assert data["rows"][0]["psnr"] == "inf" and data["settings"]["baseline"] == "bf16"  # JSON-safe
    with open(tmp_path / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 5
    assert (tmp_path / "speedup_vs_psnr.png").stat().st_size > 0
    assert (tmp_path / "precision_w4a8.png").is_file()
    page = (tmp_path / "index.html").read_text()
    assert "w4a8" in page and "videos/" in page
    assert len(list((tmp_path / "videos").iterdir())) == 5
    assert paths["html"] == tmp_path / "index.html"


def test_one_slow_probe_does_not_move_a_speedup():
    from sixbit.bench.harness import speedups

    def row(method, s_per_video, probes=None, runs=(1.0, 1.0, 1.0)):
        return {"method": method, "status": "ok", "s_per_video": s_per_video, "run_seconds": list(runs),
                **({"probes_before": probes} if probes else {})}

    # fp32 takes 2 s per video, bf16 1 s; every later method 0.5 s; one fp32 probe ran 1.6× slow
    rows = [row("fp", 2.0, runs=(2.0,) * 6), row("bf16", 1.0, {"fp": 2.0}, runs=(1.0,) * 6)]
    rows += [row(f"m{i}", 0.5, {"fp": 3.2 if i == 2 else 2.0, "bf16": 1.0}) for i in range(5)]
    speedups(rows, n_prompts=1, baseline="bf16", runs=3)
    by = {r["method"]: r for r in rows}
    assert by["bf16"]["speedup"] == 1.0 and by["bf16"]["speedup_fp32"] == 2.0 and by["fp"]["speedup"] == 0.5
    for i in range(5):  # the slow probe sits next to m1 and m2: the median of four ignores it
        assert by[f"m{i}"]["speedup"] == 2.0 and by[f"m{i}"]["speedup_fp32"] == 4.0


def test_calibration_pairs_are_balanced_over_every_attribute():
    from collections import Counter

    from sixbit.bench.harness import calibration_pairs
    from sixbit.zoo.shapes import HELDOUT_PAIRS, parse_prompt

    for n in (4, 8, 12, 24):
        pairs = calibration_pairs(n)
        assert len({p for p, _ in pairs}) == n and [s for _, s in pairs] == list(range(20_000, 20_000 + n))
        assert not {s for _, s in pairs} & {s for _, s in HELDOUT_PAIRS}
        for key in ("color", "shape", "direction"):
            counts = Counter(parse_prompt(p)[key] for p, _ in pairs)
            assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == min(n, {"shape": 3}.get(key, 4))
