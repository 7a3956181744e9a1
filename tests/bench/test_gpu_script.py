"""benchmarks/gpu/run.py --dry-run: the GPU benchmark's code, on CPU at toy sizes."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "run.py"


def test_gpu_benchmark_dry_run_writes_its_section(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_run", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "BENCHMARKS.md"
    assert script.main(["--dry-run", "--output", str(out), "--frames", "13", "--settings", "fp,w8a8,balanced,tdc",
                        "--compile", "fp", "--backend", "eager", "--steps", "2"]) == 0
    text = out.read_text()
    assert "<!-- sixbit:begin gpu -->" in text and "DRY RUN on CPU" in text
    # every kernel check agrees with its twin (Triton interpreted here; torch's GEMMs refusing what CUDA
    # refuses), and every row ran: FP8 writes bf16 as on CUDA (its twin too: a rounding apart at most)
    checks = [line for line in text.splitlines() if line.startswith(("| INT8 W8A8", "| W4A16", "| NVFP4 × NVFP4",
                                                                      "| INT8 attention, E"))]
    assert len(checks) == 7 and "FAILED" not in text
    assert all(float(line.rsplit("|", 2)[1]) < 1e-5 for line in checks), checks
    fp8 = [line for line in text.splitlines() if line.startswith("| FP8")]
    assert len(fp8) == 1 and float(fp8[0].rsplit("|", 2)[1]) < 2 ** -7
    # every kernel path of a quantized linear: taken with a GPU's decisions and within float rounding of
    # its twin, or said why not (AMX INT8 CPUs only; static scales need a fitted quantizer)
    paths = {line.split(" | ")[0][2:]: line for line in text.splitlines()
             if line.startswith("| ") and line.count(" | ") == 4 and not line.startswith("| path")}
    ran = {"fp", "fp-unpacked", "fp-dense", "w4a16", "int8", "int8-fused", "nvfp4", "nvfp4-emulated"}
    assert set(paths) == ran | {"int8-packed", "int8-folded", "int8-static"}
    assert all(float(paths[p].rsplit("|", 2)[1]) < 1e-5 for p in ran), paths
    assert "Triton fused quantize" in paths["int8-fused"] and "Triton dequantize-in-the-GEMM" in paths["w4a16"]
    assert "torch._scaled_mm FP4" in paths["nvfp4"]
    # the INT8 attention kernel agrees with its twin within its named tolerance (2⁻⁹·max|V|)
    attention_check = [line for line in text.splitlines() if line.startswith("| INT8 attention (")]
    assert len(attention_check) == 1 and float(attention_check[0].rsplit("|", 2)[1]) < 2 ** -9
    # attention timed against SDPA at the toy config's 13-frame token count, within INT8 attention's error
    int8_rows = [line for line in text.splitlines() if line.startswith("| 13 | 72 | INT8 (sixbit Triton) |")]
    assert "| 13 | 72 | fp32 SDPA |" in text and len(int8_rows) == 1
    assert float(int8_rows[0].rsplit("|", 2)[1]) < 0.03  # ‖Δ‖ / ‖SDPA‖
    assert "| toy | FFN up |" in text and "not run" not in text
    for setting in ("fp", "w8a8", "balanced", "tdc"):
        assert f"| {setting} | 13 | eager |" in text
    assert "| fp | 13 | compiled |" in text and "every call runs at INT8" in text
