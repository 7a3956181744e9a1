"""The length curve (issue 60): one transformer call of a CogVideoX-2B-sized model at 1,024,
5,626 and 17,776 tokens, bf16 against every preset as picked and against sparse attention, each
setting in fresh processes → BENCHMARKS.md (section ``length``).

    python benchmarks/bench_length.py                 # ~70 min on 2 cores
    python benchmarks/bench_length.py --quick         # small lengths, 1 block, 1 round: checks the script
    ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI python benchmarks/bench_length.py --name length-no-amx \\
        --json benchmarks/results/length_no_amx.json # the same with AMX capped off

The model: CogVideoX-2B's configuration with random bf16 weights, written once as a diffusers
folder and loaded with ``from_pretrained``, then cut to its first ``blocks`` transformer blocks
before any conversion (a whole call at 17,776 tokens takes ~20 min of bf16 on 2 cores; every
block of a CogVideoX call has one shape, so the ratio of a cut call is the ratio of the whole one
up to the patch embedding and output layers, which are under 1 % of the call; *s / full call*
scales the cut call's time by 30 / blocks). The inputs are what a user's pipeline makes: latents
of ``frames × height × width`` (patch 2: a quarter of that many video tokens) + 226 text tokens,
CFG batch 2, timestep 500.

Settings. *as picked*: ``convert_model(model, None, preset)`` and no other call, so sixbit's
per-machine layout decides what runs (``w4a8``: its formats and branch ranks with round-to-nearest
values, ``bench_real_size``'s ``w4a8 (layout)``: GPTQ and the scale search change values, not the
work, and need calibration generations). *sparse 0.15*: the bf16 model with
``apply_sparse_attention(density=0.15, warmup_steps=0)`` (a fixed budget: on random weights the
adaptive mode rightly keeps every head dense). *w8a8-sparse 0.15*: the stacked preset
(``w8a8``, the delta cache, sparse attention) with its sparse attention at that fixed budget and
no dense warm-up; one lone call, so the cache runs every block (on random weights it skips
nothing anyway). *(compact)*, *(fast)* (``--settings "w4a8 (compact),w4a8 (fast)"``): that
``layout=``, whatever sixbit would pick (compact: the stored weights alone, re-rounded per call):
whether the kept INT8 copies pay at a length.

Each round runs every setting once, each in a fresh process (load, convert, one warm-up call that
also compiles the kernels, then the median of ``--repeats`` calls); a row is the median over
``--rounds`` rounds, its ratio against the bf16 processes' median of the same run. The first
round also profiles one more call by op kind. *attention* rows time the attention op alone at
the length's real shape (batch 2, 30 heads, d64) in one process: bf16 SDPA against the
block-sparse kernel at density 0.15 (compiled flex attention, sixbit's mask at that budget),
calls alternating, medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench_cpu_speed import KINDS, _inputs, _latent_size, _Profile
from bench_real_size import _config, _peak_gib, _run_child, log, run_child_mode

ROOT = Path(__file__).resolve().parents[1]
MODEL = "CogVideoX-2B"
FULL_BLOCKS = 30
# (key, row name, latent frames, latent side, blocks timed): 4 frames of 32×32; 13 and 49 frames of 480×720
LENGTHS = (("1k", "1,024 + 226", 4, "32", 6), ("5.6k", "5,400 + 226", 4, "60x90", 2),
           ("17.8k", "17,550 + 226", 13, "60x90", 1))
SPARSE = "sparse 0.15"
STACKED = "w8a8-sparse 0.15"
SETTINGS = ("bf16", "w8a8", "w4a8", SPARSE, STACKED)
DENSITY = 0.15


# ----------------------------------------------------------------------------- children

def _model(folder: str, setting: str, blocks: int):
    """The model cut to ``blocks`` blocks, in ``setting`` (see the module docstring)."""
    import diffusers
    import torch

    import sixbit
    from sixbit.presets import resolve

    layout = {}  # as picked: sixbit's own choice
    for choice in ("compact", "fast"):
        if setting.endswith(f" ({choice})"):
            layout, setting = {"layout": choice}, setting.removesuffix(f" ({choice})")
    model = diffusers.CogVideoXTransformer3DModel.from_pretrained(folder, torch_dtype=torch.bfloat16)
    model.transformer_blocks = model.transformer_blocks[:blocks]
    sparse = sixbit.SparseAttentionConfig(density=DENSITY, warmup_steps=0)
    if setting == SPARSE:
        sixbit.apply_sparse_attention(model, sparse)
    elif setting == STACKED:
        config = resolve("w8a8-sparse")
        config.methods = tuple(sparse if isinstance(m, sixbit.SparseAttentionConfig) else m for m in config.methods)
        sixbit.convert_model(model, None, config, **layout)
    elif setting == "w4a8":  # its formats and branch ranks, round-to-nearest values: the same work
        sixbit.convert_model(model, None, _config("w4a8 (layout)"), **layout)
    elif setting != "bf16":
        sixbit.convert_model(model, None, setting, **layout)
    return model.eval().requires_grad_(False)


def child_call(folder: str, setting: str, blocks: int, frames: int, side: str, repeats: int, profile: int) -> dict:
    """Time one call of ``setting`` (median of ``repeats`` after a warm-up); profile one more if asked."""
    import torch

    import sixbit

    t0 = time.perf_counter()
    model = _model(folder, setting, blocks)
    load_s = time.perf_counter() - t0
    inputs = _inputs(torch.bfloat16, frames, side)
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            model(**inputs, return_dict=False)
            times.append(time.perf_counter() - t0)
        prof_out = None
        if profile:
            with _Profile().installed() as prof:
                t0 = time.perf_counter()
                model(**inputs, return_dict=False)
                prof_out = {"seconds": prof.seconds, "total_s": time.perf_counter() - t0}
    laid = sixbit.layout_of(model) if setting != "bf16" else None
    state = sixbit.sparse_attention_of(model)
    return {"call_s": statistics.median(times[1:]), "first_s": times[0], "load_s": load_s, "profile": prof_out,
            "layout": None if laid is None else laid.describe(), "peak_gib": _peak_gib(),
            "density": None if state is None else state.achieved_density}


def child_attention(frames: int, side: str, repeats: int) -> dict:
    """bf16 SDPA against the block-sparse kernel at density 0.15 on this length's attention shape."""
    import torch
    import torch.nn.functional as F

    from sixbit.kernels.block_sparse import block_sparse_attention
    from sixbit.methods.sparse_attention.mask import TokenGrid, budget_rung, ladder, tile_order

    h, w = _latent_size(side)
    grid = TokenGrid(frames, h // 2, w // 2, 226, True)
    order = tile_order(grid, 128)
    rungs = ladder(grid, 128, 1, order)
    rung = rungs[budget_rung(rungs, DENSITY)]
    table = rung.table.expand(30, *rung.table.shape)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 30, grid.tokens, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    dense_s, sparse_s = [], []
    with torch.no_grad():
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v)
            dense_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            block_sparse_attention(q, k, v, table, 128)
            sparse_s.append(time.perf_counter() - t0)
    return {"tokens": grid.tokens, "density": rung.density, "sdpa_s": statistics.median(dense_s[1:]),
            "sparse_s": statistics.median(sparse_s[1:])}


# ----------------------------------------------------------------------------- parent

def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def section(r: dict) -> str:
    title = "The length curve: one call at 1k, 5.6k and 17.8k tokens (CPU, issue 60)"
    lines = [
        f"## {title}" if not r.get("command") else f"## {title}: {r['command'].split()[-1]}",
        "",
        f"Written by `python benchmarks/bench_length.py{r.get('command', '')}`. Machine: {r['machine']}"
        f"{r.get('caps', '')}. One transformer call of a {MODEL}-sized model (random bf16 weights; CFG batch 2), "
        "cut to its first *blocks* of 30 blocks (every block has one shape: *s / full call* scales by 30 / blocks), "
        f"each setting in {r['rounds']} fresh process{'es' if r['rounds'] > 1 else ''} (median of {r['repeats']} "
        "calls after a warm-up in each; the row: the median over processes), its ratio against the bf16 "
        "processes' median of the same run. **Baseline: bf16**, the fastest full-precision dtype of this CPU. "
        "Preset rows are the model **as picked** (`convert_model` and no other call: sixbit's layout decides). "
        f"*{SPARSE}*: bf16 with `apply_sparse_attention(density={DENSITY}, warmup_steps=0)`; *{STACKED}*: the "
        "`w8a8-sparse` preset (w8a8, delta cache, sparse attention) with that fixed budget: random weights keep "
        "every head dense in the adaptive mode and give the cache nothing to skip, so the speed rows use the budget "
        "and quality comes from the trained shipped models (`length-quality`). Sparse attention here is compiled "
        "flex attention; the activations' INT8 arithmetic runs for real (`torch._int_mm` or oneDNN). *kept density*: "
        "the share of (query, key) block pairs the sparse calls ran: the largest window within the budget, which "
        "grows in whole steps (text and a global block included), so a budget of 0.15 keeps what its grid allows.",
        "",
        "| video + text tokens | blocks | setting | s / call (cut) | s / full call | vs bf16 | kept density | peak RSS GiB |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for length in r["lengths"]:
        runs = length["runs"]
        base = _median(runs["bf16"], "call_s")
        for setting, rs in runs.items():
            s = _median(rs, "call_s")
            if s is None:
                lines.append(f"| {length['name']} | {length['blocks']} | {setting} | "
                             f"{next(x['error'] for x in rs if 'error' in x)} | | | | |")
                continue
            density = _median(rs, "density")
            lines.append(f"| {length['name']}{'†' * bool(length.get('rerun'))} | {length['blocks']} | {setting} | {s:.2f} | "
                         f"{s * FULL_BLOCKS / length['blocks']:.0f} | **{base / s:.2f}×** | "
                         f"{'–' if density is None else f'{density:.2f}'} | {max(x.get('peak_gib', 0) for x in rs):.2f} |")
    if any(length.get("rerun") for length in r["lengths"]):
        lines += ["", "† Rerun later (`--update --lengths ...`), its bf16 processes with it: the first run of this "
                  "length shared the machine with other work."]
    lines += [x for note in r.get("notes", []) for x in ("", note)]  # what happened in this run, in words
    lines += ["", "The attention op alone at each length's shape (batch 2, 30 heads, d64, bf16; one process, calls "
              "alternating, medians):", "", "| tokens | SDPA s | block-sparse s (density) | vs SDPA |", "|---:|---:|---:|---:|"]
    for length in r["lengths"]:
        a = length.get("attention", {})
        if "sdpa_s" in a:
            lines.append(f"| {a['tokens']:,} | {a['sdpa_s']:.3f} | {a['sparse_s']:.3f} ({a['density']:.2f}) | "
                         f"**{a['sdpa_s'] / a['sparse_s']:.2f}×** |")
    lines += ["", "Profile of one call of the cut model (s, first round; *other*: modulation arithmetic, residual adds, "
              "reshapes, the tile reorder around sparse attention, embeddings):", "",
              "| tokens | setting | " + " | ".join(KINDS) + " | other | total |", "|---|---|" + "---:|" * (len(KINDS) + 2)]
    for length in r["lengths"]:
        for setting, rs in length["runs"].items():
            p = next((x["profile"] for x in rs if x.get("profile")), None)
            if p is None:
                continue
            sec = p["seconds"]
            lines.append(f"| {length['name']} | {setting} | " + " | ".join(f"{sec[k]:.2f}" if sec[k] else "–" for k in KINDS)
                         + f" | {p['total_s'] - sum(sec.values()):.2f} | {p['total_s']:.2f} |")
    layouts = sorted({x["layout"] for length in r["lengths"] for rs in length["runs"].values() for x in rs if x.get("layout")})
    if layouts:
        lines += ["", "What sixbit chose as picked: " + "; ".join(f"`{x}`" for x in layouts) + "."]
    checks = _checks(r)
    lines += ["", "Checks (issue 60, this CPU kind): " + "; ".join(checks) + "."] if checks else []
    return "\n".join(lines) + "\n"


def _checks(r: dict) -> list[str]:
    out = []
    bars = {"5,400 + 226": (("w8a8", 1.3), (STACKED, 1.8)), "17,550 + 226": ((STACKED, 2.5),)}
    for length in r["lengths"]:
        runs = length["runs"]
        base = _median(runs["bf16"], "call_s")
        for setting, bar in bars.get(length["name"], ()):
            s = _median(runs.get(setting, []), "call_s")
            if s is not None:
                out.append(f"`{setting}` at {length['name']} ≥ {bar}× bf16: **{'yes' if base / s >= bar else 'no'}** "
                           f"({base / s:.2f}×)")
        a = length.get("attention", {})
        if length["name"] == "17,550 + 226" and "sdpa_s" in a:
            ratio = a["sdpa_s"] / a["sparse_s"]
            out.append(f"sparse attention at 17,776 tokens ≥ 3× SDPA: **{'yes' if ratio >= 3 else 'no'}** ({ratio:.2f}×)")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--lengths", default=",".join(k for k, *_ in LENGTHS), help="which of the three rows: 1k, 5.6k, 17.8k")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per setting and length")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per process, after a warm-up")
    parser.add_argument("--name", default="length", help="BENCHMARKS.md section to write")
    parser.add_argument("--workdir", default="/tmp/sixbit-real-size")
    parser.add_argument("--rss-limit-gib", type=float, default=16.0)
    parser.add_argument("--section", action="store_true", help="only write the section from --json")
    parser.add_argument("--profile-only", action="store_true", help="profile one call of every setting of --lengths "
                        "in the existing --json, one fresh process each, into rows that have no profile")
    parser.add_argument("--update", action="store_true", help="rerun --lengths into the existing --json: the other "
                        "lengths stay (each length's ratios are against the bf16 processes of its own run)")
    parser.add_argument("--quick", action="store_true", help="1 block, 1 round, small grids: checks the script")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "length.json"))
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    if args.child:
        return run_child_mode({"call": child_call, "attention": child_attention}, args.child)

    from report import machine_description, update_section

    if args.section:
        update_section(args.output, args.name, section(json.loads(Path(args.json).read_text())))
        return 0
    blocks_on_disk = max(b for *_, b in LENGTHS)
    folder = Path(args.workdir) / f"{MODEL.replace('.', '_')}-{blocks_on_disk}-blocks"
    if not (folder / "config.json").exists():
        log(f"writing random bf16 weights ({blocks_on_disk} blocks) to {folder}")
        log(json.dumps(_run_child(["write", MODEL, str(folder), str(blocks_on_disk)], args.rss_limit_gib, log)))
    lengths = [x[1:] for x in LENGTHS if x[0] in args.lengths.split(",")]
    if args.quick:
        lengths = [("256 + 226", 4, "16", 1)]
        args.rounds, args.repeats = 1, 1
    if args.profile_only:
        r = json.loads(Path(args.json).read_text())
        for length in r["lengths"]:
            if length["name"] not in {x[0] for x in lengths}:
                continue
            for setting, rs in length["runs"].items():
                if any(x.get("profile") for x in rs):
                    continue
                log(f"{length['name']} tokens, profile: {setting}")
                c = _run_child(["call", str(folder), setting, str(length["blocks"]), str(length["frames"]),
                                length["side"], "1", "1"], args.rss_limit_gib, log, script=__file__)
                rs[0]["profile"] = c.get("profile")
                Path(args.json).write_text(json.dumps(r, indent=1))
        update_section(args.output, args.name, section(r))
        return 0
    caps = {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY") if os.environ.get(k)}
    r = {"machine": machine_description(), "rounds": args.rounds, "repeats": args.repeats, "lengths": [],
         "caps": "".join(f"; `{k}={v}`" for k, v in caps.items()),
         "command": "" if args.name == "length" else f" --name {args.name}"}
    os.environ.pop("SIXBIT_LAYOUT", None)  # the rows as picked take sixbit's default
    settings = list(dict.fromkeys(["bf16", *filter(None, args.settings.split(","))]))
    for name, frames, side, blocks in lengths:
        length = {"name": name, "frames": frames, "side": side, "blocks": blocks, "runs": {s: [] for s in settings}}
        r["lengths"].append(length)
        for round_ in range(args.rounds):
            for setting in settings:
                log(f"{name} tokens, round {round_ + 1}: {setting}")
                c = _run_child(["call", str(folder), setting, str(blocks), str(frames), side, str(args.repeats),
                                str(int(round_ == 0))], args.rss_limit_gib, log, script=__file__)
                length["runs"][setting].append(c)
                log(json.dumps({k: v for k, v in c.items() if k != "profile"}))
                if not args.quick:  # what is measured survives a failure later in the run
                    Path(args.json).with_suffix(".partial.json").write_text(json.dumps(r, indent=1))
        log(f"{name} tokens: attention alone")
        length["attention"] = _run_child(["attention", str(frames), side, str(max(args.repeats, 2))],
                                         args.rss_limit_gib, log, script=__file__)
        log(json.dumps(length["attention"]))
    if args.update:
        previous = json.loads(Path(args.json).read_text())
        rerun = {length["name"]: length for length in r["lengths"]}
        for length in rerun.values():
            length["rerun"] = True
        previous["lengths"] = [rerun.pop(x["name"], x) for x in previous["lengths"]] + list(rerun.values())
        r = previous
    text = section(r)
    if args.quick:
        print(text)
        return 0
    Path(args.json).write_text(json.dumps(r, indent=1))
    update_section(args.output, args.name, text)
    log(f"wrote section {args.name} of {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
