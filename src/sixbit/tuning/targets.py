"""A tuning run's arguments, checked before anything runs.

Stage 1 costs a calibration run per layer and format, so what can be known without it is
refused up front, each with one line naming the argument: the target (:func:`target`), the
search's size (:func:`~.search.check_size`), the candidate formats (:func:`candidates`), a format
that fits none of the tuned layers and a budget below every assignment the candidates allow
(:func:`check_plan`, on the layers' shapes: :class:`~.library.CandidatePlan`). A format that fits
only some layers is not an error (the others choose among the other formats) but is said, with
the layers and why (:func:`fit_notes`).
"""

from __future__ import annotations

import math
from collections import Counter

from .. import formats as formats_
from ..config.validate import show
from .library import CandidatePlan
from .search import Constraint


def target(max_bits, min_psnr, max_bytes, time_budget_s) -> Constraint:
    """The :class:`~.search.Constraint` of the arguments; ``time_budget_s`` checked too."""
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float))
                                      or not time_budget_s > 0):
        raise ValueError(f"time_budget_s must be a number of seconds > 0, got {show(time_budget_s)}")
    return Constraint(max_bits, max_bytes, min_psnr)


def check_seed(seed) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be a whole number (the same seed gives the same result), got {show(seed)}")


#: How stage 1 measures a layer in a format: ``"blocks"`` its block's output error on the kept
#: block inputs, mapped to video error (:mod:`.blocks`); ``"generation"`` a whole calibration
#: generation per layer and format (:mod:`.sensitivity`).
SENSITIVITY_MODES = ("blocks", "generation")


def check_sensitivity(mode) -> None:
    if mode not in SENSITIVITY_MODES:
        raise ValueError(f"sensitivity must be one of {', '.join(map(repr, SENSITIVITY_MODES))} ('blocks': priced on "
                         f"the kept block inputs, fast; 'generation': a whole generation per layer and format), "
                         f"got {show(mode)}")


def candidates(formats) -> tuple[str | None, ...]:
    """The candidate formats, full precision (``None``) added: every name known, at least one quantized."""
    if not isinstance(formats, (list, tuple)) or not formats:
        raise ValueError(f"formats must be a non-empty list of format names (None: 16-bit), got {show(formats)}")
    for f in formats:
        if f is not None and not isinstance(f, str):
            raise ValueError(f"formats must hold format names (strings) or None (16-bit), got {show(f)} in it")
        if f is not None and len(f) > 60:
            raise ValueError(f"formats: unknown format {show(f)}; sixbit.formats.available() lists the names")
        if f is not None:
            try:
                formats_.get(f)
            except ValueError as e:
                raise ValueError(f"formats: {e}") from None
    if all(f is None for f in formats):
        raise ValueError("formats holds no quantized format, only None (16-bit): add at least one, e.g. 'int8'")
    return tuple(dict.fromkeys([*formats, None]))  # full precision is always the reference


def _names(layers: list[str], limit: int = 3) -> str:
    shown = ", ".join(layers[:limit])
    return shown + (f" and {len(layers) - limit} more" if len(layers) > limit else "")


def _sizes(plan: CandidatePlan, layers: list[str]) -> str:
    return ", ".join(str(k) for k in sorted({plan.in_features[n] for n in layers}))


def _smaller_block(fmt: str, in_features: list[int]) -> str | None:
    """``fmt`` with the largest registered smaller group that divides every one of ``in_features``."""
    block, gcd = formats_.get(fmt).block_size, math.gcd(*in_features)
    for b in sorted((b for b in range(1, block) if gcd % b == 0), reverse=True):
        name = fmt.replace(f"-g{block}", f"-g{b}")
        if name != fmt and name in formats_.available():
            return name
    return None


def check_plan(plan: CandidatePlan, constraint: Constraint | None = None) -> None:
    """Refuse a candidate format that fits none of the tuned layers, and a budget below the
    fewest bits or bytes the candidates allow (every layer in its smallest candidate)."""
    problems = []
    for fmt in (f for f in plan.candidates if f is not None):
        if len(plan.unfit(fmt)) == len(plan.bits):
            block = formats_.get(fmt).block_size
            other = _smaller_block(fmt, list(plan.in_features.values()))
            problems.append(f"{fmt!r} fits none of the {len(plan.bits)} tuned layers: its block of {block} weights "
                            f"divides none of their in_features ({_sizes(plan, list(plan.bits))})"
                            + (f"; use e.g. {other!r} or drop it" if other else "; drop it"))
    if problems:
        raise ValueError("formats: " + "; ".join(problems))
    if constraint is not None and constraint.budget:
        _check_budget(plan, constraint)


def _check_budget(plan: CandidatePlan, constraint: Constraint) -> None:
    smallest = Counter()
    for bits in plan.bits.values():
        fmt = min(bits, key=bits.get)
        smallest["16-bit" if fmt is None else fmt] += 1
    how = f"every tuned layer in its smallest candidate ({', '.join(f'{f} × {n}' for f, n in smallest.items())})"
    bare = [n for n, bits in plan.bits.items() if set(bits) == {None}]
    why = (f"; {len(bare)} of the {len(plan.bits)} layers fit no quantized candidate (in_features "
           f"{_sizes(plan, bare)}: not a multiple of their blocks) and count 16 bits" if bare else "")
    fix = "a format that fits them" if bare else "a smaller format"
    if constraint.max_bits is not None and plan.fewest_bits() > constraint.max_bits + 1e-9:
        fewest = plan.fewest_bits()
        raise ValueError(f"max_bits={constraint.max_bits:g} is below the fewest bits the candidate formats allow: "
                         f"{fewest:.2f} bits per weight with {how}{why}; give max_bits ≥ {math.ceil(fewest * 100) / 100:.2f}, "
                         f"or {fix} in formats")
    if constraint.max_bytes is not None and plan.fewest_bytes() > constraint.max_bytes:
        fewest = plan.fewest_bytes()
        raise ValueError(f"max_bytes={constraint.max_bytes} ({constraint.max_bytes / 2**20:.2f} MiB) is below the "
                         f"fewest bytes the candidate formats allow: {fewest} ({fewest / 2**20:.2f} MiB) with {how}{why}; "
                         f"give max_bytes ≥ {fewest}, or {fix} in formats (or a smaller base)")


def fit_notes(plan: CandidatePlan) -> list[str]:
    """One line per candidate format that fits only some of the tuned layers: which, and why
    (their ``in_features`` is not a multiple of its block), and what those layers get instead."""
    notes = []
    for fmt in (f for f in plan.candidates if f is not None):
        unfit = plan.unfit(fmt)
        if not unfit:
            continue
        bare = [n for n in unfit if set(plan.bits[n]) == {None}]
        instead = ("no other format fits them: they stay 16-bit" if len(bare) == len(unfit) else
                   "they choose among the other formats" if not bare else
                   f"{len(bare)} of them fit no other format and stay 16-bit")
        notes.append(f"format {fmt!r} fits {len(plan.bits) - len(unfit)} of the {len(plan.bits)} tuned layers: "
                     f"{len(unfit)} have in_features ({_sizes(plan, unfit)}) that are not a multiple of its block of "
                     f"{formats_.get(fmt).block_size} weights ({_names(unfit)}); {instead}")
    return notes


__all__ = ["SENSITIVITY_MODES", "candidates", "check_plan", "check_seed", "check_sensitivity", "fit_notes", "target"]
