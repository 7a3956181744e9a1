"""What a resumable streamed conversion costs per block at real widths → BENCHMARKS.md (section
``conversion-resume``).

    python benchmarks/bench_resume.py            # Wan2.1-1.3B and Wan2.1-14B widths
    python benchmarks/bench_resume.py --quick    # Wan2.1-1.3B only, printed, not written

A streamed conversion (:func:`sixbit.convert_pretrained`) keeps each finished part in
``<output>.sixbit-progress`` with its sha256 (:mod:`sixbit.checkpoint.resume`) and, for GPTQ
presets, the next block's kept inputs. Measured here, with one real block of each model
(random bf16 weights, converted with ``w4a8-rtn``: the packed bytes of ``w4a8``, whose GPTQ
changes values, not sizes): writing that finished block and hashing it, verifying it again on a
resume, and writing, hashing and reading back the kept inputs of the calibration that
``conversion-block`` uses (two calls of 4 latent frames at 480p, 6,240 tokens, batch 2: the
hidden states, the 512 text tokens, the time embedding in bf16 and the rotary tables in fp32).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENS, TEXT, BATCH, CALLS = 6240, 512, 2, 2


def _block(name: str):
    import diffusers
    import torch

    import sixbit
    from bench_real_size import CONFIGS

    cls, config = CONFIGS[name]
    torch.manual_seed(0)
    model = getattr(diffusers, cls)(**{**config, "num_layers": 1}).to(torch.bfloat16)
    sixbit.convert_model(model, None, "w4a8-rtn")
    return model, config["num_attention_heads"] * config["attention_head_dim"], config["attention_head_dim"]


def _calls(dim: int, head_dim: int) -> list:
    import torch

    bf16 = {"dtype": torch.bfloat16}
    return [((), {"hidden_states": torch.randn(BATCH, TOKENS, dim, **bf16),
                  "encoder_hidden_states": torch.randn(BATCH, TEXT, dim, **bf16),
                  "temb": torch.randn(BATCH, 6, dim, **bf16),
                  "rotary_emb": (torch.randn(1, TOKENS, 1, head_dim), torch.randn(1, TOKENS, 1, head_dim))})
            for _ in range(CALLS)]


def measure(name: str, work: Path) -> dict:
    import torch

    from sixbit.checkpoint.resume import Progress

    model, dim, head_dim = _block(name)
    progress = Progress(work / name, {"model": name}, restart=True)
    progress.start()
    t0 = time.perf_counter()
    progress.add_part(1, "blocks.0", model.blocks[0], type(model).__name__, "blocks.0.")
    part_write = time.perf_counter() - t0
    part_bytes = (progress.folder / "part-00001.safetensors").stat().st_size
    t0 = time.perf_counter()
    assert Progress(work / name, {"model": name}, restart=False).verified(["blocks.0"]) == {"blocks.0"}
    part_verify = time.perf_counter() - t0
    calls = _calls(dim, head_dim)
    kept_bytes = sum(t.numel() * t.element_size() for _, kw in calls for v in kw.values()
                     for t in (v if isinstance(v, tuple) else (v,)))
    t0 = time.perf_counter()
    progress.add_part(2, "blocks.1", torch.nn.Linear(1, 1), "Linear", inputs=(2, calls))  # a 1-weight part: the inputs' cost
    kept_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = Progress(work / name, {"model": name}, restart=False).kept_inputs(2, None)
    kept_read = time.perf_counter() - t0
    assert torch.equal(back[0][1]["hidden_states"], calls[0][1]["hidden_states"])
    progress.remove()
    return {"dim": dim, "part_mib": part_bytes / 2**20, "part_write_s": part_write, "part_verify_s": part_verify,
            "kept_mib": kept_bytes / 2**20, "kept_write_s": kept_write, "kept_read_s": kept_read}


def section(results: dict, workdir: str) -> str:
    from report import machine_description

    lines = [
        "## Resumable streamed conversion: what keeping the finished blocks costs",
        "",
        f"Written by `python benchmarks/bench_resume.py` on {machine_description()}, files in `{workdir}`. One block "
        "of each model (random bf16 weights, `w4a8-rtn`: the packed size of `w4a8`). *block write s*: the finished "
        "block written to `<output>.sixbit-progress` atomically and hashed (sha256) — once per block; *verify s*: "
        "hashed again on a resume. *kept inputs*: what a GPTQ preset saves at each block boundary, for the "
        f"calibration of `conversion-block` ({CALLS} calls, batch {BATCH}, {TOKENS:,} tokens + {TEXT} text tokens; "
        "bf16, rotary tables fp32); *write s*: written and hashed, once per block; *read s*: verified and read back "
        "on a resume. Compare with the seconds per block of `conversion-block`, and with what rebuilding the kept "
        "inputs without them would cost: the calibration generations again plus a replay of every finished block.",
        "",
        "| model | width | block MiB | block write s | verify s | kept inputs MiB | write s | read s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['dim']} | {r['part_mib']:.1f} | {r['part_write_s']:.2f} | {r['part_verify_s']:.2f} | "
                     f"{r['kept_mib']:.1f} | {r['kept_write_s']:.2f} | {r['kept_read_s']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="Wan2.1-1.3B,Wan2.1-14B")
    parser.add_argument("--workdir", default=None, help="where the files are written (default: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="Wan2.1-1.3B only, printed")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        models = ["Wan2.1-1.3B"] if args.quick else args.models.split(",")
        results = {name: measure(name, Path(work)) for name in models}
    text = section(results, args.workdir or tempfile.gettempdir())
    if args.quick:
        print(text)
    else:
        from report import update_section

        update_section(args.output, "conversion-resume", text)
        print(f"wrote section conversion-resume of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
