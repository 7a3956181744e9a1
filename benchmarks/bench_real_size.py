"""Real sizes: CogVideoX-2B/5B and Wan2.1-1.3B/14B configurations with random bf16 weights written
to disk, converted block by block (``sixbit.convert_pretrained``), loaded onto a meta-device
model (``sixbit.load_pretrained``), and one transformer block timed per precision
→ BENCHMARKS.md (section ``real-size``).

    python benchmarks/bench_real_size.py                         # every model, every preset
    python benchmarks/bench_real_size.py --models CogVideoX-2B --presets w8a8
    python benchmarks/bench_real_size.py --quick                 # Wan2.1-1.3B's width, 2 blocks

Each measurement runs in a fresh child process; its peak RSS is the kernel's high-water mark
(``VmHWM``), and the parent kills a child whose RSS passes ``--rss-limit-gib`` (the machine has
no swap). Weights are random (the shape is what costs) and written once under ``--workdir``
(28.6 GB for Wan2.1-14B; not committed). *bytes*: every tensor the checkpoint holds, the
low-rank branch included, against the bf16 folder's tensors. ``w4a8 (layout)`` is the ``w4a8``
preset's formats and branch ranks with round-to-nearest values: GPTQ, the scale search and the
branch refits change values, not one byte, and cost calibration generations in bf16 (which this
CPU computes at under 1 GFLOP/s) or hours of scale search at these sizes.

Block timing: one block of each model, random weights, ``--tokens`` video tokens (+ the text
tokens), median of ``--repeats`` calls after a warm-up; *per step* multiplies by the number of
blocks (a projection, labelled as such: the layers outside the blocks are left out).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {  # diffusers transformer/config.json of each published model
    "CogVideoX-2B": ("CogVideoXTransformer3DModel", dict(
        num_attention_heads=30, attention_head_dim=64, in_channels=16, out_channels=16, time_embed_dim=512,
        text_embed_dim=4096, num_layers=30, sample_width=90, sample_height=60, sample_frames=49, patch_size=2,
        max_text_seq_length=226, use_rotary_positional_embeddings=False, use_learned_positional_embeddings=False)),
    "CogVideoX-5B": ("CogVideoXTransformer3DModel", dict(
        num_attention_heads=48, attention_head_dim=64, in_channels=16, out_channels=16, time_embed_dim=512,
        text_embed_dim=4096, num_layers=42, sample_width=90, sample_height=60, sample_frames=49, patch_size=2,
        max_text_seq_length=226, use_rotary_positional_embeddings=True, use_learned_positional_embeddings=False)),
    "Wan2.1-1.3B": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6)),
    "Wan2.1-14B": ("WanTransformer3DModel", dict(
        patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6)),
}
TEXT_TOKENS = {"CogVideoXTransformer3DModel": 226, "WanTransformer3DModel": 512}
PRESETS = ("w8a8", "w4a8-rtn", "w4a8 (layout)")
PRECISIONS = ("fp32", "bf16", "w8a8", "w4a8 (layout)")
SHARD_BYTES = 2 << 30


# ----------------------------------------------------------------------------- children

def _peak_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _config(preset: str):
    """A preset name; ``w4a8 (layout)``: the w4a8 preset's formats and branch ranks with
    round-to-nearest values (GPTQ, the scale search and the branch refits change values, not
    bytes; they need calibration generations or hours of CPU at these sizes); ``w4a8
    (full-precision inputs)``: the w4a8 preset calibrated on the full-precision blocks' outputs."""
    import dataclasses

    from sixbit.presets import resolve

    if preset == "w4a8 (full-precision inputs)":
        config = resolve("w4a8")
        return dataclasses.replace(config, weights=dataclasses.replace(config.weights, calibration_inputs="full_precision"))
    if preset != "w4a8 (layout)":
        return resolve(preset)
    config = resolve("w4a8")
    return dataclasses.replace(config, weights=dataclasses.replace(
        config.weights, gptq=False, scale_rule="absmax", lowrank_iterations=0))


def _empty(name: str):
    import accelerate
    import diffusers

    cls, kwargs = CONFIGS[name]
    with accelerate.init_empty_weights():
        return getattr(diffusers, cls)(**kwargs)


def _random(shape, dtype, key: str, seed: int):
    """Random weights with sane scales: 2-D weights ~ N(0, 1/fan_in), 1-D norms 1, biases 0."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if len(shape) >= 2:
        fan_in = 1
        for s in shape[1:]:
            fan_in *= s
        return (torch.randn(shape, generator=g) / fan_in ** 0.5).to(dtype)
    if key.endswith("bias"):
        return torch.zeros(shape, dtype=dtype)
    return torch.ones(shape, dtype=dtype) if "norm" in key else (0.02 * torch.randn(shape, generator=g)).to(dtype)


def child_write(name: str, folder: str, blocks: int | None) -> dict:
    """A diffusers model folder with random bf16 weights, written shard by shard."""
    import torch

    from sixbit.files.safetensors import SafetensorsWriter

    t0 = time.perf_counter()
    cls, kwargs = CONFIGS[name]
    if blocks is not None:
        kwargs = {**kwargs, "num_layers": blocks}
    import accelerate
    import diffusers

    with accelerate.init_empty_weights():
        model = getattr(diffusers, cls)(**kwargs)
    state = model.state_dict()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    shards, current, size, weight_map = [], {}, 0, {}
    for key, t in state.items():
        current[key] = (tuple(t.shape), t.numel() * 2)
        size += t.numel() * 2
        if size >= SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
    if current:
        shards.append(current)
    total = 0
    for i, shard in enumerate(shards):
        file = f"diffusion_pytorch_model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        with SafetensorsWriter(out / file) as w:
            for j, (key, (shape, nbytes)) in enumerate(shard.items()):
                w.add(key, _random(shape, torch.bfloat16, key, seed=hash((i, j)) & 0xFFFF))
                weight_map[key] = file
                total += nbytes
            w.finish({"format": "pt"})
    (out / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps({"_class_name": cls, "_diffusers_version": diffusers.__version__, **kwargs}))
    return {"bytes": total, "seconds": time.perf_counter() - t0, "peak_gib": _peak_gib()}


def _calibration(folder: str, frames: int, side: int | str):
    """For GPTQ presets: ``calibration(transformer)`` runs two transformer calls (two timesteps, as
    the two CFG branches of two steps would) on random latents of ``frames`` × ``side`` × ``side``
    (or ``"HxW"``: 480p is ``"60x104"``) and random text embeddings: with random weights there is
    no video to calibrate on; what this measures is the streamed GPTQ's memory and time at the
    model's real width."""
    import torch

    height, width = (int(v) for v in side.split("x")) if isinstance(side, str) else (side, side)

    config = json.loads((Path(folder) / "config.json").read_text())
    cogvideox = config["_class_name"].startswith("CogVideoX")
    text = torch.randn(2, TEXT_TOKENS[config["_class_name"]], config.get("text_embed_dim") or config["text_dim"],
                       generator=torch.Generator().manual_seed(1))

    def calibration(transformer):
        dtype = next(p.dtype for p in transformer.parameters() if p.device.type != "meta")
        g = torch.Generator().manual_seed(0)
        c = config["in_channels"]
        shape = (2, frames, c, height, width) if cogvideox else (2, c, frames, height, width)
        with torch.no_grad():
            for t in (900, 300):
                transformer(hidden_states=torch.randn(shape, generator=g).to(dtype),
                            encoder_hidden_states=text.to(dtype), timestep=torch.tensor([t, t]), return_dict=False)

    return calibration


def child_convert(folder: str, preset: str, output: str, frames: int, side: int | str) -> dict:
    import torch

    import sixbit

    torch.set_num_threads(1)
    base = _rss_gib()
    config = _config(preset)
    calibration = _calibration(folder, frames, side) if config.needs_calibration else None
    result = sixbit.convert_pretrained(folder, config, output, calibration, progress=False)
    from sixbit.files.safetensors import read_safetensors

    _, tensors = read_safetensors(output)
    tensor_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    parts = [s for p, s in result.part_seconds.items() if p not in ("outside blocks", "calibration runs")]
    return {"seconds": result.seconds, "block_s": statistics.median(parts), "peak_gib": _peak_gib(), "base_gib": base,
            "checkpoint_bytes": result.checkpoint_bytes, "tensor_bytes": tensor_bytes}


def child_load(folder: str, checkpoint: str) -> dict:
    import sixbit

    base = _rss_gib()
    t0 = time.perf_counter()
    model = sixbit.load_pretrained(checkpoint, folder)
    seconds = time.perf_counter() - t0
    held = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {"seconds": seconds, "peak_gib": _peak_gib(), "base_gib": base, "held_bytes": held}


def child_block(name: str, folder: str, precision: str, tokens: int, repeats: int) -> dict:
    """Time block 0 of ``name`` in ``precision`` on ``tokens`` video tokens (+ text tokens)."""
    import torch

    from sixbit.builder import quantized_linear
    from sixbit.files.safetensors import SafetensorsFolder
    from sixbit.models import iter_blocks
    from sixbit.builder import materialize

    torch.set_num_threads(1)
    model = _empty(name)
    _, block_name, block, _ = next(iter(iter_blocks(model)))
    shards = SafetensorsFolder(folder)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    materialize(model, shards.read([k for k in shards.layout if k.startswith(f"{block_name}.")]), dtype)
    if precision in ("w8a8", "w4a8 (layout)"):
        from sixbit.builder import plan_layers

        config = _config(precision)
        for layer, (fmt, hb, role) in plan_layers(model, config.weights).items():
            if layer.startswith(f"{block_name}."):
                parent, _, child = layer.rpartition(".")
                q = quantized_linear(model.get_submodule(layer), fmt, hb, config.weights, role)
                q.act_mode = config.activations
                setattr(model.get_submodule(parent), child, q)
    cls, kwargs = CONFIGS[name]
    width = kwargs["num_attention_heads"] * kwargs["attention_head_dim"]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, tokens, width, generator=g).to(dtype)
    text = torch.randn(1, TEXT_TOKENS[cls], width, generator=g).to(dtype)
    if cls.startswith("CogVideoX"):
        call = dict(hidden_states=hidden, encoder_hidden_states=text, temb=torch.randn(1, 512, generator=g).to(dtype))
    else:
        head = kwargs["attention_head_dim"]
        angles = torch.rand(1, tokens, 1, head, generator=g) * 6.28
        call = dict(hidden_states=hidden, encoder_hidden_states=text,
                    temb=torch.randn(1, 6, width, generator=g).to(dtype), rotary_emb=(angles.cos(), angles.sin()))
    times = []
    with torch.no_grad():
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            block(**call)
            if i:
                times.append(time.perf_counter() - t0)
    return {"block_s": statistics.median(times), "blocks": kwargs["num_layers"], "peak_gib": _peak_gib()}


# ----------------------------------------------------------------------------- parent

def run_child_mode(children: dict, child_args: list[str]) -> int:
    """A child process's part: ``children[kind](*args)`` (digits as ints, ``none`` as None), its
    result printed as the JSON line :func:`_run_child` reads."""
    kind, *rest = child_args
    typed = [int(x) if x.isdigit() else (None if x == "none" else x) for x in rest]
    print(json.dumps(children[kind](*typed)))
    return 0


def log(msg: str) -> None:
    """A timestamped progress line of a parent process."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _run_child(args: list[str], limit_gib: float, log, script: str = __file__, src: Path = ROOT / "src",
               env: dict | None = None) -> dict:
    """Run ``script`` (default: this one) in child mode on the package in ``src``, with ``env``
    added to its environment; kill it past ``limit_gib`` of RSS. Returns its JSON (or an error)."""
    proc = subprocess.Popen([sys.executable, script, "--child", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **(env or {}), "PYTHONPATH": str(src)})
    killed = {}

    def guard():
        while proc.poll() is None:
            try:
                rss = next(int(line.split()[1]) for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS:")) / 2**20
            except (OSError, StopIteration):
                break
            if rss > limit_gib:
                killed["rss"] = rss
                proc.kill()
            time.sleep(0.2)

    threading.Thread(target=guard, daemon=True).start()
    out, err = proc.communicate()
    if killed:
        return {"error": f"killed at {killed['rss']:.1f} GiB RSS (limit {limit_gib} GiB)"}
    if proc.returncode < 0:  # killed from outside (SIGTERM, SIGKILL): its last line is not why it stopped
        return {"error": f"stopped by {signal.Signals(-proc.returncode).name}"}
    if proc.returncode != 0:
        log(err[-2000:])
        return {"error": (err.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(out.strip().splitlines()[-1])


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f}"


def section(results: dict, args) -> str:
    from report import machine_description

    lines = [
        "## Real sizes: streamed conversion, loading without a full-precision copy, one block per precision",
        "",
        f"Written by `python benchmarks/bench_real_size.py` on {machine_description()}. Random weights written to disk "
        "in bf16 as diffusers shards (the shape is what costs). Peak RSS: the child process's high-water mark "
        "(`VmHWM`), its Python + torch baseline included (*baseline* column). `w4a8 (layout)`: the `w4a8` preset's "
        "formats and branch ranks (NVFP4, low-rank branch ≤ 0.5 bit and rank ≤ 16, modulation NVFP4 weight-only) with "
        "round-to-nearest values: GPTQ, the MSE scale search and the branch refits change values, not bytes, and cost "
        "calibration generations in bf16 (under 1 GFLOP/s on this CPU, see the block times) or hours of search here. "
        "*vs bf16*: bf16 tensor bytes / checkpoint tensor bytes (every tensor, the branch included).",
        "",
        "| model | parameters | bf16 GiB | preset | checkpoint GiB | vs bf16 | convert s | s / block | convert peak GiB | load s | load peak GiB | baseline GiB |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        w = r.get("write", {})
        params = w.get("bytes", 0) / 2
        for preset, c in r.get("convert", {}).items():
            ld = r.get("load", {}).get(preset, {})
            if "error" in c:
                lines.append(f"| {name} | {params / 1e9:.2f} B | {_gib(w.get('bytes', 0))} | `{preset}` | – | – | – | – | {c['error']} | – | – | – |")
                continue
            lines.append(
                f"| {name} | {params / 1e9:.2f} B | {_gib(w['bytes'])} | `{preset}` | {_gib(c['tensor_bytes'])} | "
                f"{w['bytes'] / c['tensor_bytes']:.2f}× | {c['seconds']:.0f} | {c['block_s']:.1f} | {c['peak_gib']:.2f} | "
                f"{ld.get('seconds', float('nan')):.1f} | {ld.get('peak_gib', float('nan')):.2f} | {c['base_gib']:.2f} |")
    timed = {n: r["blocks"] for n, r in results.items() if r.get("blocks")}
    if timed:
        lines += ["", f"One block, {args.tokens} video tokens + the text tokens, median of {args.repeats} calls, one thread; "
                  "*per step* = block × blocks (a projection: layers outside the blocks left out). `w8a8` and "
                  "`w4a8 (layout)` run INT8 activations through `torch._int_mm` (real integer GEMM); NVFP4 weights are "
                  "converted to INT8 per call. Speedups against fp32 **and** bf16 of the same run.", "",
                  "| model | precision | s / block | per step (s, projected) | vs fp32 | vs bf16 | peak GiB |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for name, blocks in timed.items():
            fp32 = blocks.get("fp32", {}).get("block_s")
            bf16 = blocks.get("bf16", {}).get("block_s")
            for precision, b in blocks.items():
                if "error" in b:
                    lines.append(f"| {name} | {precision} | {b['error']} | – | – | – | – |")
                    continue
                ratio = lambda ref: f"{ref / b['block_s']:.2f}×" if ref else "–"  # noqa: E731
                lines.append(f"| {name} | {precision} | {b['block_s']:.2f} | {b['block_s'] * b['blocks']:.0f} | "
                             f"{ratio(fp32)} | {ratio(bf16)} | {b['peak_gib']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    parser.add_argument("--models", default=",".join(CONFIGS))
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="block timing ('' to skip)")
    parser.add_argument("--tokens", type=int, default=64, help="video tokens of the timed block call (default 64)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--calib-frames", type=int, default=2, help="GPTQ presets: latent frames of the calibration calls")
    parser.add_argument("--calib-side", default="16", help="GPTQ presets: latent height and width of the calibration "
                        "calls (one number, or HxW: 60x104 is 480p)")
    parser.add_argument("--workdir", default="/tmp/sixbit-real-size")
    parser.add_argument("--keep", action="store_true", help="keep the random folders and checkpoints")
    parser.add_argument("--rss-limit-gib", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="Wan2.1-1.3B with 2 blocks: checks the script")
    parser.add_argument("--json", help="write raw results here (and read previous ones from it to merge)")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.child:
        return run_child_mode({"write": child_write, "convert": child_convert, "load": child_load, "block": child_block}, args.child)

    results = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else {}
    models = ["Wan2.1-1.3B"] if args.quick else args.models.split(",")
    for name in models:
        r = results.setdefault(name, {})
        folder = Path(args.workdir) / name.replace(".", "_")
        blocks = 2 if args.quick else None
        if not (folder / "config.json").exists():
            log(f"{name}: writing random bf16 weights to {folder}")
            r["write"] = _run_child(["write", name, str(folder), str(blocks or "none")], args.rss_limit_gib, log)
            log(f"{name}: {r['write']}")
        for preset in [p for p in args.presets.split(",") if p]:
            ckpt = Path(args.workdir) / f"{name}-{preset.replace(' ', '_')}.safetensors"
            log(f"{name}: converting with {preset}")
            r.setdefault("convert", {})[preset] = c = _run_child(
                ["convert", str(folder), preset, str(ckpt), str(args.calib_frames), str(args.calib_side)], args.rss_limit_gib, log)
            log(f"{name} {preset}: {c}")
            if "error" not in c:
                r.setdefault("load", {})[preset] = ld = _run_child(["load", str(folder), str(ckpt)], args.rss_limit_gib, log)
                log(f"{name} {preset} load: {ld}")
            if not args.keep and ckpt.exists():
                ckpt.unlink()
        for precision in [p for p in args.precisions.split(",") if p]:
            log(f"{name}: timing one block in {precision}")
            r.setdefault("blocks", {})[precision] = b = _run_child(
                ["block", name, str(folder), precision, str(args.tokens), str(args.repeats)], args.rss_limit_gib, log)
            log(f"{name} {precision}: {b}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        if not args.keep and not args.quick:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    if not args.quick:
        from report import update_section

        update_section(args.output, "real-size", section({n: results[n] for n in CONFIGS if n in results}, args))
        log(f"wrote section real-size of {args.output}")
    else:
        print(section(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
