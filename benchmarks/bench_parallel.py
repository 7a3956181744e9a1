"""One process against two (``sixbit.parallel``, gloo on this CPU) → BENCHMARKS.md (section ``parallel``).

    python benchmarks/bench_parallel.py              # every model and setting; writes the section
    python benchmarks/bench_parallel.py --quick      # checks the script (2 steps, 1 timed call)
    python benchmarks/bench_parallel.py --rows benchmarks/results/parallel.json   # the section from a saved run

Models: the two shipped ones (their pipelines, fp32 as shipped, 10 steps: *s / step* is a
denoising step, both CFG branches) and a CogVideoX-2B-width transformer with 2 blocks (30 heads
× 64, FFN 5120, random weights, bf16; a plain loop: *s / step* is one call with the CFG batch of
2 on 4 latent frames of 32×32 = 1024 video + 226 text tokens), full precision and ``w4a8-rtn``.
Settings, each in fresh processes: one process with 1 thread and with 2 threads (the same two
cores the two processes use), two processes (``torchrun --nproc-per-node 2``, 1 thread each)
in each mode, and the driver (issue 47): the seed's ``TensorParallelWrapper(model, device_ids=[0, 1])``
in one plain process, which starts 2 CPU worker processes (1 thread each, tensor mode) and sends
them every transformer call, with and without ``chunk_size=32`` (tokens per feed-forward call).
*comm*: the share of a profiled step spent in collectives (torch.profiler: the gloo
and functional-collective ops, waits included). *weights MiB / rank*: parameters and buffers one
rank holds (packed weights as stored). *peak RSS MiB*: the process's high-water mark (``VmHWM``,
the model file's mapped pages included) and, in brackets, its proportional share (``Pss``: pages
shared with other processes split between them) after the timed calls; torchrun rows: rank 0;
driver rows: the larger worker, then the caller, which keeps its whole copy. *video PSNR*: the two-process video against the
one-process one. CPU measurements: on GPUs with NVLink the balance is another one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("shapes-cogvideox", "shapes-wan", "cogvideox-2b-width")
SETTINGS = ("1 process, 1 thread", "1 process, 2 threads", "2 processes, tensor", "2 processes, sequence",
            "driver, 2 workers", "driver, 2 workers, chunk_size 32")
COLLECTIVE = ("c10d", "gloo", "all_gather", "all_to_all", "allreduce", "all_reduce", "alltoall", "allgather",
              "wait_tensor")


def _build(model: str, preset: str):
    """The model to time: a shipped pipeline, or the 2B-width transformer (``preset`` applied)."""
    import sixbit
    from sixbit.zoo.shapes import load_pipeline

    torch.manual_seed(0)
    if model.startswith("shapes-"):
        pipe = load_pipeline(model.removeprefix("shapes-"))
        if preset != "fp":
            sixbit.convert_model(pipe, None, preset)
        return pipe
    from diffusers import CogVideoXTransformer3DModel

    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16, time_embed_dim=512,
        text_embed_dim=4096, num_layers=2, sample_width=32, sample_height=32, sample_frames=13, patch_size=2,
        temporal_compression_ratio=4, max_text_seq_length=226).to(torch.bfloat16).eval()
    if preset != "fp":
        sixbit.convert_model(transformer, None, preset)
    return transformer


def _step_fn(model: str, target, steps: int):
    if model.startswith("shapes-"):
        def run():
            return target(["a red circle moving right"], num_inference_steps=steps, guidance_scale=4.0,
                          generator=[torch.Generator().manual_seed(0)]).frames
        return run, steps
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(2, 4, 16, 32, 32, generator=g).to(torch.bfloat16)
    text = torch.randn(2, 226, 4096, generator=g).to(torch.bfloat16)
    t = torch.tensor([500, 500])

    @torch.no_grad()
    def call():
        return target(hidden_states=latents, encoder_hidden_states=text, timestep=t, return_dict=False)[0].float().numpy()
    return call, 1


def _collective_share(run) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        run()
        total = time.perf_counter() - t0
    comm = sum(e.self_cpu_time_total for e in prof.key_averages() if any(c in e.key.lower() for c in COLLECTIVE))
    return comm / 1e6 / total


def _memory_mib(pid: int) -> tuple[float, float]:
    """A process's peak RSS (``VmHWM``) and its proportional set size now (``Pss``), in MiB."""
    def field(path: str, name: str) -> float:
        line = next(line for line in Path(path).read_text().splitlines() if line.startswith(name + ":"))
        return int(line.split()[1]) / 1024
    return field(f"/proc/{pid}/status", "VmHWM"), field(f"/proc/{pid}/smaps_rollup", "Pss")


def worker(model: str, preset: str, setting: str, out: str, quick: bool) -> None:
    """One setting of one model; rank 0 (or the one process) writes its measurements to ``out``."""
    from sixbit.parallel import TensorParallelWrapper

    steps, calls = (2, 1) if quick else (10, 3)
    pipe = _build(model, preset)
    mode = {"2 processes, tensor": "tensor", "2 processes, sequence": "sequence"}.get(setting)
    if mode:
        dist.init_process_group("gloo")
        pipe = TensorParallelWrapper(pipe, mode=mode)
    elif setting.startswith("driver"):
        pipe = TensorParallelWrapper(pipe, device_ids=[0, 1], chunk_size=32 if "chunk_size" in setting else None)
    run, per = _step_fn(model, pipe, steps)
    run()  # warm-up
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        output = run()
        times.append((time.perf_counter() - t0) / per)
    memory = {"peak_rss_mib": _memory_mib(os.getpid())}  # before the profiler's own memory
    if setting.startswith("driver"):  # the workers' memory; this process is the caller
        memory = {"caller_rss_mib": memory["peak_rss_mib"],
                  "peak_rss_mib": max(_memory_mib(p.pid) for p in pipe.driver.processes)}
        weights = pipe.weight_bytes()
        pipe.close()
    else:
        target = pipe.transformer if hasattr(pipe, "transformer") else pipe
        weights = sum(t.numel() * t.element_size() for t in (*target.parameters(), *target.buffers()))
    share = _collective_share(run) if mode else None  # the driver's collectives run in its workers
    if not mode or dist.get_rank() == 0:
        np.save(out + ".npy", np.asarray(output, dtype=np.float32))
        Path(out).write_text(json.dumps({
            "s_per_step": statistics.median(times), "comm_share": share, "weights_mib": weights / 2**20, **memory}))
    if mode:
        dist.destroy_process_group()


def measure(model: str, preset: str, setting: str, quick: bool, folder: Path) -> dict:
    """Run one setting in fresh processes; its measurements plus the output (for the PSNR)."""
    out = str(folder / f"{model}-{preset}-{SETTINGS.index(setting)}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "2" if setting == "1 process, 2 threads" else "1"}
    args = [__file__, "--worker", model, preset, setting, out] + (["--quick"] if quick else [])
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
                if setting.startswith("2 processes") else [sys.executable])
    run = subprocess.run(launcher + args, env=env, capture_output=True, text=True, check=False)
    if run.returncode:
        raise RuntimeError(f"{model} {preset} {setting} failed:\n{run.stdout[-2000:]}{run.stderr[-4000:]}")
    row = json.loads(Path(out).read_text())
    row["output"] = np.load(out + ".npy")
    return row


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    from sixbit.eval.metrics import psnr

    if a.ndim == 5:  # shapes videos in [0, 1]
        return float(np.mean([psnr(x, y) for x, y in zip(a, b)]))
    peak = float(np.abs(b).max())  # transformer outputs: against the one-process output's peak
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(peak**2 / mse)


def section(rows: list[dict], quick: bool) -> str:
    from report import machine_description

    lines = [
        "## Two processes against one (issues 20 and 47: `sixbit.parallel`, CPU measurements)", "",
        f"Written by `python benchmarks/bench_parallel.py{' --quick' if quick else ''}`. Machine: {machine_description()}; "
        "gloo over shared memory on the same two cores. " + __doc__.split("\n\n", 2)[2].replace("\n", " ").strip(),
        "", "| model | weights | setting | s / step | vs 1 process, 1 thread | comm | weights MiB / rank | "
        "peak RSS MiB (Pss) / process | video PSNR dB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def memory(peak_pss) -> str:
        return f"{peak_pss[0]:.0f} ({peak_pss[1]:.0f})"
    for r in rows:
        psnr = "—" if r["psnr"] is None else ("identical" if r["psnr"] == float("inf") else f"{r['psnr']:.1f}")
        comm = "—" if r["comm_share"] is None else f"{r['comm_share'] * 100:.0f}%"
        rss = memory(r["peak_rss_mib"]) + (f"; caller {memory(r['caller_rss_mib'])}" if "caller_rss_mib" in r else "")
        lines.append(f"| {r['model']} | {r['preset']} | {r['setting']} | {r['s_per_step']:.3f} | "
                     f"{r['base'] / r['s_per_step']:.2f}× | {comm} | {r['weights_mib']:.1f} | {rss} | {psnr} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("MODEL", "PRESET", "SETTING", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="2 steps, 1 timed call; prints the table only")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--rows", help="write the section from this saved run (benchmarks/results/parallel.json)")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.worker:
        worker(*args.worker, args.quick)
        return 0
    from report import update_section

    results = ROOT / "benchmarks" / "results" / "parallel.json"
    if args.rows:  # the section again from a full run's saved rows
        update_section(args.out, "parallel", section(json.loads(Path(args.rows).read_text()), False))
        print(f"wrote section 'parallel' of {args.out} from {args.rows}")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for model in args.models:
            for preset in ("fp", "w4a8-rtn"):
                by_setting = {s: measure(model, preset, s, args.quick, Path(folder)) for s in SETTINGS}
                single = by_setting[SETTINGS[0]]
                for setting, r in by_setting.items():
                    rows.append({**{k: v for k, v in r.items() if k != "output"}, "model": model, "preset": preset,
                                 "setting": setting, "base": single["s_per_step"],
                                 "psnr": None if setting.startswith("1") else _psnr(r["output"], single["output"])})
                    print(rows[-1], file=sys.stderr, flush=True)
    body = section(rows, args.quick)
    if args.quick or args.models != list(MODELS):
        print(body)
        return 0
    update_section(args.out, "parallel", body)
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps(rows, indent=1))
    print(f"wrote section 'parallel' of {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
