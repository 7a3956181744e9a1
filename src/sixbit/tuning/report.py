"""What a tuning run found: :class:`TuneReport` (:func:`~.tuner.tune_model`)."""

from __future__ import annotations

import dataclasses
from collections import Counter

from ..presets import ConvertConfig
from .search import Constraint, SearchResult
from .sensitivity import Sensitivity


@dataclasses.dataclass
class TuneReport:
    """Everything a tuning run found (:func:`~.tuner.tune_model`).

    Attributes:
        config: the tuned :class:`ConvertConfig` (``weights.layer_formats`` holds the map).
        constraint: the target it was tuned to.
        layers: the tuned layers' names; ``variants[i]`` their candidate formats (``None``:
            full precision), fewest bits first, and ``variant_bits[i]`` their stored bits.
        sensitivity: stage 1's errors and proxy (:class:`~.sensitivity.Sensitivity`): measured
            with whole generations (``mode="generation"``) or predicted from block-output errors
            (``mode="blocks"``, :mod:`.blocks`; ``fit`` says how well the factor fitted).
        greedy / best: ``{"bits", "psnr", "psnr_bound", "bytes", "formats",
            "calibration_inputs", "measured"}`` of the greedy assignment and of the search's pick:
            calibration PSNR (dB, the mean over the videos) of the model ``convert_model`` makes
            from them with that ``calibration_inputs`` (the better of the two:
            :meth:`~.tuner.Tuner._calibrated`), and that mean minus one standard error
            (``psnr_bound``, what ``min_psnr`` is checked against:
            :func:`~sixbit.calibration.quality.psnr_bound`). The pick is always measured (whole
            generations); under ``mode="blocks"`` the greedy one is predicted (``measured``
            False), and ``best["checks"]`` holds each check round's measured PSNR (the mean
            − 1 SE under ``min_psnr``, a round per tightening).
        uniform: ``{format label: {"bits", "psnr", "psnr_bound", "bytes", "formats", "measured"}}``
            of every uniform assignment, measured with the candidates (predicted under blocks).
        search: the genetic search's :class:`~.search.SearchResult`.
        unmeasured: ``{layer: format}`` of the tuned layers the calibration run never called: not
            searched (no run measures them), they keep the base config's format; ``notes`` says so.
        seconds: time per stage (``pick``: converting the pick and the greedy assignment with
            sequential GPTQ, :meth:`Tuner._calibrated`).
        block_seconds: under ``mode="blocks"``, each block's share of stage 1 (its Hessians, its
            candidates built and priced, the replay that feeds the next block), in block order.
    """

    config: ConvertConfig
    constraint: Constraint
    layers: list[str]
    variants: list[list[str | None]]
    variant_bits: list[list[float]]
    sensitivity: Sensitivity
    greedy: dict
    best: dict
    uniform: dict[str, dict]
    search: SearchResult
    seconds: dict[str, float]
    calibration: dict
    notes: list[str] = dataclasses.field(default_factory=list)
    unmeasured: dict[str, str] = dataclasses.field(default_factory=dict)
    mode: str = "generation"
    fit: object | None = None
    block_seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def reached(self) -> bool:
        """Whether the target was met: a budget always is (one below every assignment is
        refused); ``min_psnr`` when the pick's mean PSNR minus one standard error reaches it."""
        return self.constraint.min_psnr is None or self.best["psnr_bound"] >= self.constraint.min_psnr

    def summary(self) -> str:
        """A few lines: target, result, the greedy and uniform baselines, the format counts."""
        counts = Counter("16-bit" if f is None else f for f in self.best["formats"].values())
        lines = [
            f"tuned {len(self.layers)} layers to {self.constraint.describe()} "
            f"(calibration: {' '.join(str(v) for v in (self.calibration.get('count'), self.calibration['source']) if v)})",
            (f"  search:  {self.best['bits']:.2f} bits, {self.best['psnr']:.2f} dB (mean − 1 SE "
             f"{self.best['psnr_bound']:.2f} dB; {self.best['calibration_inputs']} calibration inputs), "
             f"{self.best['bytes'] / 2**20:.2f} MiB  ({self.search.stopped}: {len(self.search.history)} generations, "
             f"{len(self.search.measured)} assignments scored)"),
            (f"  greedy:  {self.greedy['bits']:.2f} bits, {self.greedy['psnr']:.2f} dB (mean − 1 SE "
             f"{self.greedy['psnr_bound']:.2f} dB; " + (f"{self.greedy['calibration_inputs']} calibration inputs)"
                                                       if self.greedy.get("measured", True) else "predicted)")),
        ]
        lines += [f"  uniform {label}: {u['bits']:.2f} bits, {u['psnr']:.2f} dB{'' if u.get('measured', True) else ' (predicted)'}"
                  for label, u in self.uniform.items()]
        lines.append("  formats: " + ", ".join(f"{label} × {n}" for label, n in counts.most_common()))
        if self.fit is not None:
            checks = ", ".join(f"{c:.2f}" for c in self.best.get("checks", []))
            factors = ", ".join(f"{v:.3g} ({role})" for role, v in self.fit.factors.items())
            lines.append(f"  sensitivity: priced on kept block inputs, × {factors} to video error (fitted on "
                         f"{len(self.fit.points)} generations: Spearman {self.fit.spearman:+.2f}); the pick checked "
                         f"with whole generations ({checks} dB)")
        kind = "measured" if self.mode == "generation" else "predicted"
        lines.append(f"  sensitivity proxy vs {kind} error: Spearman {self.sensitivity.spearman:+.2f}")
        lines.append("  time: " + ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items()))
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


__all__ = ["TuneReport"]
