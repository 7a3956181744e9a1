"""Every cache on the shipped models, speedup against PSNR, with cache-dit's DBCache (issues 23 and 62).

The delta cache (``tdc``) swept over its error budget, calibrated to PSNR targets, its earlier
rule and ablations, diffusers' caches, cache-dit's DBCache configurations and the quantized preset
with the cache (``balanced``) → BENCHMARKS.md (section ``cache-pareto``) and
``benchmarks/plots/cache_pareto.png``.

    python benchmarks/bench_caches.py                          # both models side by side, then the section
    python benchmarks/bench_caches.py --serial                 # one model after the other: quieter timings
    python benchmarks/bench_caches.py --model shapes-wan       # one model (one harness process), no section
    python benchmarks/bench_caches.py --merge                  # the section from the results already written
    python benchmarks/bench_caches.py --quick                  # checks the script: 1 prompt × 4 steps, scratch files

Each model runs the harness (``python -m sixbit.cli bench --prompts 4 --steps 20
--calibration-prompts 16 --threads 1 --quiet``) in its own process with one CPU thread, the two
side by side, like ``run_all.py``'s lanes (about 30 minutes each on 2 shared cores); full outputs
in ``benchmarks/results/caches-<model>/`` (``results.json``/``results.csv`` are committed; the skip
maps and ``index.html`` with the videos are not).

The methods (:data:`METHODS`), chosen from skip shares measured at 20 steps:

* ``tdc-B`` at error budgets :data:`KNOB`, from no skips (0.1) to the warm-up's and final steps'
  limit (75 % of block calls); ``tdc-min-X`` calibrated to X dB (:data:`MIN_PSNR`) on 16
  calibration prompts (4 let one model's harder prompts decide); ``tdc-v1-T``, the rule before
  issue 62 at threshold T; ablations of the drift term, ``final_fraction`` 0.1 (the default
  before) and a 10 % warm-up;
* diffusers' caches at ``run_all.py``'s settings plus FirstBlockCache 0.1 and 0.5 and
  TaylorSeer intervals 2 and 5;
* cache-dit's DBCache (:mod:`sixbit.bench.peer_cache_dit`): with one compute block in front
  (Fn=1) of the shipped models' four, warm-up 4 steps and at most 3 cached steps in a row, it
  can skip at most 45 % of block calls (≈ 1.7×) however high the threshold; Bn=1 at most 30 %
  (≈ 1.35×); only ``dbcache-nocap`` goes further (60 %, ≈ 2.3×). The thresholds span each
  configuration from its first skips (≈ 0.1) to that ceiling, so 3× is out of reach of all of them.

Speedups are against the uncached fp32 model, the one every cache here runs on (``--baseline fp``:
a cache changes no dtype). The ``bf16`` row — the same model in bfloat16 without a cache, what a
user who wants speed would otherwise run on this CPU — is drawn and listed for that context, and
left out of the front and the checks, which compare caches.

The checks: for every cache-dit point with 1.5× ≤ speedup ≤ 2.5×, is there a ``tdc`` point at
equal or greater speedup with higher PSNR (issue 23); is the default ``tdc`` on the Pareto front
of every cache point (all rows but the references); is the budget sweep monotonic (skip share
never falls, PSNR never rises), and the default at least as good as the rule before; does each
``min_psnr`` point reach its target on the held-out pairs, and is any diffusers or cache-dit point
at the same or higher PSNR as fast (issue 62). Speedups are wall-clock on a shared CPU and drift by
tenths; skip shares are exact, so the section also gives the cache-dit check by skip share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from sixbit.config.delta_cache import DeltaCacheConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PLOTS = ROOT / "benchmarks" / "plots"
MODELS = ("shapes-cogvideox", "shapes-wan")
SECTION = "cache-pareto"

# the knob: the error budget (default 1.0, plain `tdc`), from no skips to the warm-up's limit (since the
# tail rule 10 stops at 60 % skipped: 20 and 50 go past it, for cache-dit's fastest points; added after
# the committed results were measured)
KNOB = (0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 1.3, 1.6, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0)
TDC = ",".join([f"tdc-{b:g}" for b in KNOB] + ["tdc"]
               + ["tdc-w10-3,tdc-w10-5,tdc-nodrift,tdc-drift05,tdc-drift1"]  # ablations at the default
               + ["tdc-f10", "tdc-f10-1.3", "tdc-f10-2"]  # final_fraction 0.1: tdc-f10-1.3 is the default before
               + ["tdc-notail", "tdc-notail-3", "tdc-notail-5"]  # tail_fraction 0: streaks into the last steps
               + [f"tdc-v1-{t:g}" for t in (0.12, 0.14, 0.17, 0.25, 0.3)] + ["tdc-v1"])  # the rule before issue 62
MIN_PSNR = (30, 33, 35, 38)
CALIBRATED = ",".join([f"tdc-min-{t}" for t in MIN_PSNR] + ["balanced-min-30", "balanced-min-35"])
DIFFUSERS = ("fbcache-0.1,fbcache-0.2,fbcache-0.3,fbcache-0.4,fbcache-0.5,magcache,magcache-0.12,magcache-0.24,"
             "magcache-0.3,taylorseer-2,taylorseer-3,taylorseer-5,pab-2,fastercache-2")
CACHE_DIT = ("dbcache-0.12,dbcache-0.15,dbcache-0.2,dbcache-0.3,dbcache-0.5,"
             "dbcache-ts1-0.12,dbcache-ts1-0.15,dbcache-ts1-0.2,dbcache-ts1-0.3,dbcache-ts1-0.5,"
             "dbcache-ts2-0.12,dbcache-ts2-0.2,dbcache-ts2-0.3,dbcache-ts2-0.5,"
             "dbcache-f1b1-0.2,dbcache-f1b1-1,dbcache-f1b1-ts1-0.2,dbcache-f1b1-ts1-1,"
             "dbcache-nocap-0.2,dbcache-nocap-0.3,dbcache-nocap-0.5,dbcache-nocap-1,dbcache-nocap-2")
METHODS = f"fp,bf16,{TDC},{CALIBRATED},{DIFFUSERS},{CACHE_DIT},balanced"
QUICK = "fp,bf16,tdc,tdc-3,tdc-v1,tdc-min-35,fbcache-0.2,dbcache-0.2,dbcache-ts1-0.2,dbcache-nocap-0.5"
CHECK_RANGE = (1.5, 2.5)
DEFAULT_BUDGET = DeltaCacheConfig().error_budget  # what plain `tdc` runs with


def _bench_cmd(model: str, out: Path, quick: bool) -> list[str]:
    prompts, steps, calib = ("1", "4", "1") if quick else ("4", "20", "16")
    return [sys.executable, "-m", "sixbit.cli", "bench", "--model", model, "--methods", QUICK if quick else METHODS,
            "--prompts", prompts, "--steps", steps, "--calibration-prompts", calib, "--threads", "1", "--quiet",
            "--baseline", "fp",
            "-o", str(out)]


def _results_dir(model: str, quick: bool) -> Path:
    return RESULTS / "_parts" / f"caches-quick-{model}" if quick else RESULTS / f"caches-{model}"


def run_models(models, quick: bool, serial: bool = False) -> dict[str, tuple[int, float]]:
    """One harness process per model, one thread each, side by side (``serial``: one after the
    other, so no process shares the cores with another); returns model → (exit code, seconds)."""
    logs = RESULTS / "_parts"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    running, status = {}, {}

    def finish(model: str) -> None:
        proc, log_name, t0 = running[model]
        rc = proc.wait()
        status[model] = (rc, time.perf_counter() - t0)
        print(f"{model}: {'ok' if rc == 0 else f'FAILED (exit {rc}, see {log_name})'} in "
              f"{status[model][1] / 60:.1f} min", flush=True)

    with contextlib.ExitStack() as stack:
        for model in models:
            log = stack.enter_context(open(logs / f"caches_{model}.log", "w"))
            running[model] = (subprocess.Popen(_bench_cmd(model, _results_dir(model, quick), quick), stdout=log,
                                               stderr=subprocess.STDOUT, env=env, cwd=ROOT), log.name, time.perf_counter())
            if serial:
                finish(model)
        for model in running:
            if model not in status:
                finish(model)
    return status


# ------------------------------------------------------------------------ reading the rows


def _psnr(row) -> float:
    return float(row["psnr"])  # the harness writes "inf" for a video identical to FP


def _kind(row) -> str:
    """A configuration's base name, its knob's value left out: ``tdc`` (the error budget sweep),
    ``tdc-v1``, ``tdc-min``, ``fbcache``, ``dbcache-ts1``, …; ``balanced``, ``fp``."""
    name = row["method"]
    head, _, tail = name.rpartition("-")
    return head if head and tail.replace(".", "", 1).isdigit() else name


def _value(row) -> float | None:
    """The knob's value of a row (its ``-VALUE``, else the library's default), ``None`` if it has none."""
    name, kind = row["method"], _kind(row)
    if name != kind:
        return float(name.rpartition("-")[2])
    return {"tdc": DEFAULT_BUDGET, "tdc-v1": 0.2, "tdc-f10": DEFAULT_BUDGET, "tdc-notail": DEFAULT_BUDGET}.get(kind)


def _is_tdc(row) -> bool:
    return row["family"] == "sixbit" and _kind(row).startswith("tdc")


def load(model: str, quick: bool = False) -> dict | None:
    path = _results_dir(model, quick) / "results.json"
    if not path.is_file():
        return None
    result = json.loads(path.read_text())
    result["failed"] = [r for r in result["rows"] if r.get("status") != "ok"]
    result["rows"] = [r for r in result["rows"] if r.get("status") == "ok"]
    pool(result["rows"])
    return result


def pool(rows: list[dict]) -> None:
    """Rows that did the same work are one point timed several times: their ``speedup`` becomes the
    mean of their measured ones (kept in ``measured``), so timing drift between them cannot make
    one dominate another. The same work: the same outcome (same skipped share, same PSNR to the last
    bit: e.g. ``tdc`` and ``tdc-0.9``, or ``dbcache-0.2`` and ``dbcache-nocap-0.2`` below the cap:
    ``twins``), and for the delta cache on the full-precision model (every ``tdc*`` row) the same
    skipped share: the same block calls run, its rules only choose which. The references (fp,
    bf16) stay apart."""
    outcomes: dict = {}
    for r in rows:
        r["measured"], r["twins"] = r["speedup"], []
        if r["family"] != "reference":
            outcomes.setdefault((r["skip_share"], str(r["psnr"])), []).append(r)
    for group in outcomes.values():
        for r in group:
            r["twins"] = [q["method"] for q in group if q is not r]
    for r in rows:
        if r["family"] != "reference":
            same = ([q for q in rows if _is_tdc(q) and q["skip_share"] == r["skip_share"]] if _is_tdc(r)
                    else outcomes[(r["skip_share"], str(r["psnr"]))])
            r["pooled"] = len(same)
            r["speedup"] = sum(q["measured"] for q in same) / len(same)


def _dominates(q: dict, r: dict) -> bool:
    """``q`` is at least as good as ``r`` on speedup and PSNR and better on one."""
    return (q["speedup"] >= r["speedup"] and _psnr(q) >= _psnr(r)
            and (q["speedup"] > r["speedup"] or _psnr(q) > _psnr(r)))


def front(rows: list[dict]) -> list[dict]:
    """The rows no other row dominates (speedup and PSNR), by speedup."""
    return sorted((r for r in rows if not any(_dominates(q, r) for q in rows)), key=lambda r: r["speedup"])


def _best_tdc(tdc: list[dict], at_least: float, key: str) -> dict | None:
    """The highest-PSNR tdc row whose ``key`` (speedup or skip_share) is ≥ ``at_least``."""
    found = [t for t in tdc if t[key] >= at_least - 1e-9]
    return max(found, key=_psnr) if found else None


def _caches(result: dict) -> list[dict]:
    """Every row but the references (fp, bf16)."""
    return [r for r in result["rows"] if r["family"] != "reference"]


def check(result: dict) -> dict:
    """The done-when check on one model's rows (see the module docstring)."""
    rows = _caches(result)
    tdc = [r for r in rows if _is_tdc(r)]
    lo, hi = CHECK_RANGE
    points = []
    for r in sorted((r for r in rows if r["family"] == "cache-dit"), key=lambda r: r["speedup"]):
        if not lo <= r["speedup"] <= hi:
            continue
        by_speed = _best_tdc(tdc, r["speedup"], "speedup")
        by_skip = _best_tdc(tdc, r["skip_share"], "skip_share")
        points.append({"row": r, "tdc": by_speed, "ok": by_speed is not None and _psnr(by_speed) > _psnr(r),
                       "tdc_skip": by_skip, "ok_skip": by_skip is not None and _psnr(by_skip) > _psnr(r)})
    on_front = front(rows)
    default = next((r for r in rows if r["method"] == "tdc"), None)
    beaten_by = [q for q in rows if default is not None and _dominates(q, default)]
    # every non-tdc cache point that no tdc point beats at ≥ its speed: where the delta cache loses
    losses = []
    for r in rows:
        if _is_tdc(r) or r["speedup"] < 1.0:
            continue
        best = _best_tdc(tdc, r["speedup"], "speedup")
        if best is None or _psnr(best) <= _psnr(r):
            losses.append((r, best))
    return {"points": points, "front": on_front, "default": default, "default_on_front": default in on_front,
            "beaten_by": beaten_by, "losses": sorted(losses, key=lambda x: x[0]["speedup"]), "tdc": tdc}


def monotonic(rows: list[dict], kind: str) -> dict:
    """The sweep of ``kind`` (``tdc``: the error budget; ``tdc-v1``: the earlier threshold) in
    knob order, and every step where the skip share fell or PSNR rose as the knob grew."""
    sweep = sorted((r for r in rows if _kind(r) == kind and r["family"] == "sixbit"), key=_value)
    breaks = []
    for a, b in zip(sweep, sweep[1:]):
        if b["skip_share"] < a["skip_share"] - 1e-9:
            breaks.append((a, b, "skipped less"))
        if _psnr(b) > _psnr(a) + 1e-9:
            breaks.append((a, b, f"PSNR rose {_gap(b, a)}"))
    return {"sweep": sweep, "breaks": breaks}


def calibrated(rows: list[dict]) -> list[dict]:
    """Each ``*-min-X`` row: its target, whether its held-out PSNR reaches it, the budget it chose
    (from its note) and every diffusers or cache-dit point at the same or higher PSNR that is at
    least as fast (the done-when asks for none)."""
    peers = [r for r in rows if r["family"] in ("diffusers", "cache-dit")]
    found = []
    for r in rows:
        if not _kind(r).endswith("-min"):
            continue
        target = _value(r)
        chosen = re.search(r"chose error_budget ([0-9.]+) \(([-0-9.]+|None) dB", r.get("note", ""))
        cap = re.search(r"at most ([0-9]+) % of steps skipped", r.get("note", ""))
        faster = [q for q in peers if _psnr(q) >= _psnr(r) and q["speedup"] >= r["speedup"]]
        found.append({"row": r, "target": target, "meets": _psnr(r) >= target, "budget": chosen and chosen.group(1),
                      "cap": cap and cap.group(1),
                      "calibration_psnr": chosen and chosen.group(2), "faster_peers": faster})
    return found


# ------------------------------------------------------------------------ plot and section


def _style(kind: str):
    """(color, marker, draw a line through the sweep) per configuration."""
    styles = {
        "tdc": ("#d7191c", "o", True), "tdc-v1": ("#fc8d59", "x", True), "tdc-min": ("#d7191c", "*", False),
        "balanced": ("black", "*", False), "balanced-min": ("black", "P", False),
        "fbcache": ("#2b83ba", "s", True), "magcache": ("#5e3c99", "D", True), "taylorseer": ("#008837", "^", True),
        "pab": ("#7f7f7f", "v", False), "fastercache": ("#b15928", "P", False),
        "dbcache": ("#fdae61", "o", True), "dbcache-ts1": ("#f46d43", "^", True), "dbcache-ts2": ("#a6611a", "v", True),
        "dbcache-f1b1": ("#80cdc1", "s", True), "dbcache-f1b1-ts1": ("#018571", "s", True),
        "dbcache-nocap": ("#dfc27d", "X", True),
    }
    return styles.get(kind, ("#999999", ".", False))


def plot(results: dict[str, dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(7.5 * len(results), 5.5), squeeze=False)
    for ax, (model, res) in zip(axes[0], results.items()):
        rows = _caches(res)
        finite = [_psnr(r) for r in rows if math.isfinite(_psnr(r))]
        top = (max(finite) if finite else 40.0) + 2

        def y(r, top=top):
            return _psnr(r) if math.isfinite(_psnr(r)) else top

        kinds = list(dict.fromkeys(_kind(r) for r in rows))
        for kind in kinds:
            # a sweep in threshold order: more skipped, then lower PSNR (speed alone zigzags with the drift)
            pts = sorted((r for r in rows if _kind(r) == kind), key=lambda r: (r["skip_share"], -_psnr(r)))
            color, marker, line = _style(kind)
            label = {"tdc": "tdc (ours: the error budget swept)", "tdc-v1": "tdc, the rule before issue 62 (threshold swept)",
                     "tdc-min": f"tdc, min_psnr {'/'.join(map(str, MIN_PSNR))} dB (calibrated)",
                     "balanced": "balanced (ours: NVFP4 + DMPQ + tdc)", "balanced-min": "balanced, min_psnr 30 / 35 dB"}.get(kind, kind)
            ours = kind in ("tdc", "tdc-min", "balanced", "balanced-min")
            ax.plot([r["speedup"] for r in pts], [y(r) for r in pts], ("-" if line else "") + marker, color=color,
                    ms=9 if ours else 6, lw=1.6 if kind == "tdc" else 0.8, label=label, zorder=3 if ours else 2)
        for r in res["rows"]:
            if r["method"] == "bf16":
                ax.plot([r["speedup"]], [y(r)], "k+", ms=11, mew=2, label="bf16, no cache (fastest full-precision dtype here)")
        fr = check(res)["front"]
        ax.step([r["speedup"] for r in fr], [y(r) for r in fr], where="post", color="gray", ls="--", lw=0.8,
                label="Pareto front", zorder=1)
        default = next((r for r in rows if r["method"] == "tdc"), None)
        if default is not None:
            ax.annotate("tdc (default)", (default["speedup"], y(default)), fontsize=8, xytext=(6, 6),
                        textcoords="offset points", color="#d7191c")
        for r in rows:
            if _kind(r).endswith("-min"):
                ax.annotate(f"≥ {_value(r):g}", (r["speedup"], y(r)), fontsize=7, xytext=(4, -10),
                            textcoords="offset points", color="black" if r["method"].startswith("balanced") else "#d7191c")
        ax.axvspan(*CHECK_RANGE, color="#eeeeee", zorder=0, label=f"the check's range ({CHECK_RANGE[0]}×–{CHECK_RANGE[1]}×)")
        ax.set_xlabel("wall-clock speedup over the uncached fp32 model (shared 2-core CPU; drifts by tenths; twins pooled)")
        ax.set_ylabel(f"PSNR vs FP video (dB; identical to FP drawn at {top:.0f})")
        ax.set_title(f"{model}: every cache, {res['settings']['prompts']} prompts × {res['settings']['steps']} steps",
                     fontsize=10)
        ax.grid(alpha=0.3)
    legend = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * math.ceil(len(legend) / 6), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt_psnr(row) -> str:
    return "identical" if not math.isfinite(_psnr(row)) else f"{_psnr(row):.2f}"


def _gap(a: dict, b: dict) -> str:
    """PSNR of ``a`` minus ``b`` in dB (a video identical to FP counts as above any finite one)."""
    d = _psnr(a) - _psnr(b)
    return f"{d:+.2f} dB" if math.isfinite(d) else ("above (identical to FP)" if d > 0 else
                                                   "below (the other is identical to FP)" if d < 0 else "equal")


def _pt(row) -> str:
    quality = f"{_psnr(row):.2f} dB" if math.isfinite(_psnr(row)) else "identical to FP"
    return f"`{row['method']}` ({row['speedup']:.2f}×, {100 * row['skip_share']:.0f}%, {quality})"


def section(results: dict[str, dict], plot_path: str, command: str) -> str:
    first = next(iter(results.values()))
    s = first["settings"]
    minutes = ", ".join(f"{m} {res['total_seconds'] / 60:.1f} min" for m, res in results.items())
    lo, hi = CHECK_RANGE
    lines = [
        "## Every cache: speedup vs PSNR, with cache-dit (issues 23 and 62)",
        "",
        f"Written by `{command}`: the harness (`sixbit bench --prompts {s['prompts']} --steps {s['steps']} "
        f"--calibration-prompts {s['calibration_prompts']} --threads 1`) with only cache methods, one model per "
        f"process, {'one after the other' if '--serial' in command else 'the two side by side'} ({minutes}). "
        f"Machine: {first['machine']}. The methods:",
        "",
        f"- `tdc-B`: our delta cache on the full-precision model at error budget B, its one knob (`tdc`: the default "
        f"{DEFAULT_BUDGET:g}); `tdc-min-X`: its budget calibrated to X dB (`DeltaCacheConfig(min_psnr=X)`: the fastest "
        f"budget whose {s['calibration_prompts']} calibration videos, not these held-out ones, reach X dB, mean − 1 SE, "
        "against the uncached model, the smallest of equally fast ones, with the share of steps it skipped there as "
        "a cap); `balanced` / `balanced-min-X`: NVFP4 weights + DMPQ + the cache, the cache at "
        "the default budget / calibrated to X dB against the full-precision model (the combined model's PSNR);",
        "- `tdc-v1-T`: the rule before issue 62, at stability threshold T (budget 3×T, at most 2 skips in a row, drift "
        "0.5; `tdc-v1`: its default 0.2); ablations at the default budget: `tdc-nodrift` / `tdc-drift05` / "
        "`tdc-drift1` (drift 0 / 0.5 / 1, default 0.7), `tdc-f10-B` (`final_fraction` 0.1: the last 2 steps "
        "always computed; `tdc-f10-1.3` is the default before issue 62's last change), `tdc-notail-B` "
        "(`tail_fraction` 0: skip streaks may run into the last 2 steps), `tdc-w10-B` (10 % warm-up "
        "instead of 20 %: the only way past 75 % skipped at 20 steps);",
        "- diffusers' caches, and cache-dit's DBCache configurations (`sixbit.bench.peer_cache_dit`: Fn=1 front "
        "compute block, warm-up = the delta cache's, ≤ 3 cached steps in a row except `-nocap`; `-ts1`/`-ts2`: "
        "TaylorSeer calibrator order 1/2; `-f1b1`: the last block always computed; the suffix is "
        "`residual_diff_threshold`).",
        "",
        "**Speedups are against the uncached fp32 model**, the one every cache here runs on (a cache changes no "
        "dtype); the `bf16` row is that model in bfloat16 without a cache — the fastest full-precision dtype on "
        "this CPU, what a user who wants speed would otherwise run — listed and drawn for context, and left out of "
        "the front and the checks, which compare caches. `balanced` runs DMPQ's NVFP4 emulated on this CPU, so its "
        "speed is not its speed on a GPU with FP4 GEMMs; it is off the speed front here for that reason. "
        "**Speedups are wall-clock on a shared 2-core CPU and drift by tenths** (each is the method's median of "
        f"{s['runs']} timed runs against the median of the four fp32 generations timed nearest them; *measured*); "
        "**skipped shares are exact** (block calls not run, counted). Rows that did the same work are one point "
        "timed more than once, and *speedup* is the mean of their measured ones (*pooled*: how many): rows with the "
        "same outcome (same skipped share and bit-identical PSNR: *same outcome as*), and every `tdc*` row (the delta "
        "cache on the full-precision model) that skipped the same share of block calls: the same block calls run, "
        "its rules only choose which. The tables, the front and the checks use it. PSNR: against the FP videos "
        "of the same seeds. `tdc` and cache-dit skip nothing in their first 4 of 20 steps (warm-up); `tdc` also "
        "computes the last one, so it skips at most 75 % of block calls (`tdc-f10`: 70 %, `tdc-w10`: 85 %); "
        "cache-dit's Fn=1 and cap of 3 cached steps in a row allow at most 45 % (Bn=1: 30 %, no cap: 60 %).",
        "",
        f"![cache Pareto]({plot_path})",
    ]
    for model, res in results.items():
        c = check(res)
        on_front = {id(r) for r in c["front"]}
        lines += ["", f"### {model}", "",
                  "| method | family | speedup vs fp32 | measured | pooled | skipped | PSNR dB | on the front | same outcome as |",
                  "|---|---|---:|---:|---:|---:|---:|---|---|"]
        order = {"reference": 0, "sixbit": 1, "cache-dit": 2, "diffusers": 3}
        for r in sorted(res["rows"], key=lambda r: (order.get(r["family"], 4), _kind(r) != "tdc", _kind(r), r["speedup"])):
            lines.append(f"| {r['method']} | {r['family']} | {r['speedup']:.2f}× | {r['measured']:.2f}× | "
                         f"{r.get('pooled', 1)} | {100 * r['skip_share']:.1f}% | {_fmt_psnr(r)} | "
                         f"{'yes' if id(r) in on_front and r['family'] != 'reference' else ''} | {', '.join(r['twins'])} |")
        for r in res["failed"]:
            lines.append(f"| {r['method']} | {r['family']} | — | — | — | — | — | {r['status']}: {r['note']} | |")
        lines += [f"\n- `{r['method']}` rerun: {r['rerun']}" for r in res["rows"] if r.get("rerun")]
        lines += ["", f"**The check** (issue 23's done-when): each cache-dit point at {lo}×–{hi}× against the best "
                      "`tdc` point at equal or greater speedup; beside it, the same by skipped share (exact).", "",
                  "| cache-dit point | speedup | skipped | PSNR dB | best tdc at ≥ its speedup | tdc higher PSNR? | margin "
                  "| best tdc at ≥ its skip share | by skip share |",
                  "|---|---:|---:|---:|---|---|---:|---|---|"]
        for p in c["points"]:
            r, t, k = p["row"], p["tdc"], p["tdc_skip"]
            margin = _gap(t, r) if t is not None else "—"
            lines.append(
                f"| {r['method']} | {r['speedup']:.2f}× | {100 * r['skip_share']:.1f}% | {_fmt_psnr(r)} | "
                f"{_pt(t) if t else 'none that fast'} | {'yes' if p['ok'] else '**no**'} | {margin} | "
                f"{_pt(k) if k else 'none skips as much'} | "
                f"{('yes' if p['ok_skip'] else '**no**') + (f' ({_gap(k, r)})' if k else '')} |")
        if not c["points"]:
            lines.append(f"| no cache-dit point measured between {lo}× and {hi}× | | | | | | | | |")
        passed = sum(p["ok"] for p in c["points"])
        d = c["default"]
        if d is None:
            verdict = "the default `tdc` was not measured"
        elif c["default_on_front"]:
            verdict = f"{_pt(d)} (the default) **is on the Pareto front** of all {len(_caches(res))} cache points"
        else:
            verdict = (f"{_pt(d)} (the default) **is not on the front**: dominated by "
                       + ", ".join(_pt(q) for q in c["beaten_by"]))
        lines += ["", f"- Verdict: tdc ahead at **{passed} of {len(c['points'])}** cache-dit points in {lo}×–{hi}× "
                      f"(by skip share: {sum(p['ok_skip'] for p in c['points'])} of {len(c['points'])}); {verdict}.",
                  "- Pareto front: " + ", ".join(_pt(r) for r in c["front"]) + "."]
        if c["losses"]:
            lines.append("- Where no `tdc` point at equal or greater speedup has higher PSNR (any cache, any speed): "
                         + "; ".join(f"{_pt(r)}: " + ("no tdc point that fast" if t is None else
                                                      f"best tdc at ≥ its speedup {_pt(t)}, {_gap(t, r)}")
                                     for r, t in c["losses"]) + ".")
        else:
            lines.append("- Every other cache point has a `tdc` point at equal or greater speedup with higher PSNR.")
        lines += _knob_lines(res) + _calibrated_lines(res)
    if "--quick" not in command:
        from bench_cache_timing import lines as timing_lines

        lines += timing_lines()
    return "\n".join(lines) + "\n"


def _knob_lines(res: dict) -> list[str]:
    """Issue 62's knob checks: the budget sweep in order, the earlier rule's breaks, the default against it."""
    rows = _caches(res)
    knob, before = monotonic(rows, "tdc"), monotonic(rows, "tdc-v1")
    lines = ["", "**The knob** (issue 62): the error budget in increasing order; a larger budget must never skip less "
                 "nor give a higher PSNR.", "",
             "| error budget | skipped | PSNR dB | speedup vs fp32 |", "|---:|---:|---:|---:|"]
    lines += [f"| {_value(r):g}{' (default)' if r['method'] == 'tdc' else ''} | {100 * r['skip_share']:.0f}% | "
              f"{_fmt_psnr(r)} | {r['speedup']:.2f}× |" for r in knob["sweep"]]

    def said(m):
        if not m["sweep"]:
            return "not measured"
        if not m["breaks"]:
            return f"**monotonic** over its {len(m['sweep'])} settings"
        return "**not monotonic**: " + "; ".join(f"{_value(a):g} → {_value(b):g}: {why}" for a, b, why in m["breaks"])

    default = next((r for r in rows if r["method"] == "tdc"), None)
    lines += ["", f"- The error budget: {said(knob)}. The rule before (its threshold, `tdc-v1-T`): {said(before)}."]
    for name, what in (("tdc-v1", "the default of the rule before issue 62"),
                       ("tdc-f10-1.3", "the default before `final_fraction` 0 (budget 1.3, `final_fraction` 0.1)")):
        old = next((r for r in rows if r["method"] == name), None)
        if default is not None and old is not None:
            ok = default["skip_share"] >= old["skip_share"] and _psnr(default) >= _psnr(old)
            lines.append(f"- The default {_pt(default)} against {what}, {_pt(old)}: "
                         f"{'**as many skips or more at equal or better PSNR**' if ok else '**not** at least as good'} "
                         f"({_gap(default, old)}).")
    return lines


def _calibrated_lines(res: dict) -> list[str]:
    found = calibrated(_caches(res))
    if not found:
        return []
    lines = ["", "**`min_psnr`** (issue 62): the budget each target chose on the calibration prompts, and what it gives "
                 "on the held-out pairs.", "",
             "| method | target dB | chose budget | skip cap | calibration dB (mean − 1 SE) | held-out PSNR dB | "
             "reaches it? | speedup vs fp32 | skipped | diffusers / cache-dit points at ≥ its PSNR and ≥ its speed |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for c in found:
        r = c["row"]
        lines.append(f"| {r['method']} | {c['target']:g} | {c['budget'] or '—'} | "
                     f"{c['cap'] + ' %' if c['cap'] else '—'} | {c['calibration_psnr'] or '—'} | "
                     f"{_fmt_psnr(r)} | {'yes' if c['meets'] else '**no**'} | {r['speedup']:.2f}× | "
                     f"{100 * r['skip_share']:.0f}% | {', '.join(_pt(q) for q in c['faster_peers']) or 'none'} |")
    return lines


def merge(models, quick: bool, out: Path, command: str) -> int:
    from report import update_section

    results = {m: load(m, quick) for m in models}
    missing = [m for m, r in results.items() if r is None]
    if missing:
        print(f"no results for {', '.join(missing)} (run them first)", file=sys.stderr)
        return 1
    if quick:
        path = RESULTS / "_parts" / "cache_pareto_quick.png"
        rel = path.name
    else:
        path, rel = PLOTS / "cache_pareto.png", "benchmarks/plots/cache_pareto.png"
    plot(results, path)
    update_section(out, SECTION, section(results, rel, command))
    print(f"wrote section {SECTION!r} of {out} and {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, help="run the harness on this model only (no section)")
    parser.add_argument("--merge", action="store_true", help="only write the section and plot from existing results")
    parser.add_argument("--quick", action="store_true",
                        help="1 prompt × 4 steps, a few methods, results and section in benchmarks/results/_parts/")
    parser.add_argument("--out", help="markdown file of the section (default BENCHMARKS.md; --quick: a scratch file)")
    parser.add_argument("--serial", action="store_true",
                        help="run the models one after the other (quieter timings, twice the wall time)")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else (RESULTS / "_parts" / "caches_quick.md" if args.quick else ROOT / "BENCHMARKS.md")
    command = "python benchmarks/bench_caches.py" + (" --quick" if args.quick else "") + (" --serial" if args.serial else "")
    if args.merge:
        return merge(MODELS, args.quick, out, command)
    if args.model:
        return run_models([args.model], args.quick)[args.model][0]
    status = run_models(MODELS, args.quick, args.serial)
    rc = merge(MODELS, args.quick, out, command)
    return rc or max(code for code, _ in status.values())


if __name__ == "__main__":
    sys.exit(main())
