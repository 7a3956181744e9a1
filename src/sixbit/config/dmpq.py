"""Settings of DMPQ (:mod:`sixbit.methods.dmpq`): NVFP4 or INT8 activations per block and step."""

from __future__ import annotations

import dataclasses

from ..nn.precision import ACT_BITS, ActMode
from .validate import report, type_problems
from .serialize import Serializable


@dataclasses.dataclass
class DMPQConfig(Serializable):
    """Settings of DMPQ.

    Args:
        target_bits: GEMM-FLOP-weighted average activation bits that calibration aims for
            (between 4.5 = all NVFP4 and 8 = all INT8; default 6.0). Lower: faster on FP4
            hardware, more error.
        threshold: an explicit predicted-error threshold; overrides ``target_bits`` when set.
        hadamard_block: online Hadamard block for the NVFP4 weights (default 128; layers whose
            input size it does not divide use the largest smaller block that does).
        error_at: where calibration measures the error the predictor learns.
            ``"steps"`` (default): what NVFP4 activations in a step range cost the final
            video, measured once per step range with NVFP4 in all its blocks (``step_groups``
            extra runs; ``run`` must return the videos), split among the range's blocks by
            their own output error. ``"video"``: the same cost measured per cell of a
            ``step_groups`` × ``block_groups`` grid (``step_groups × block_groups`` extra
            runs: ~2× the fit's time, and less gap closure on the shipped models in three
            of four measurements, BENCHMARKS ``dmpq-pricing``). ``"block"``: the error at the block's own output (the
            paper's target; two runs, but a small early error can cost the video more than a
            large late one).
        step_groups: contiguous step ranges of the ``"video"`` and ``"steps"`` grids (default 5).
        block_groups: contiguous block ranges of the ``"video"`` grid (default 4; models with
            fewer blocks use one per block; ``"steps"`` prices all blocks of a range at once).
        low: ``"nvfp4"`` (default): the low precision is NVFP4 on every device (emulated where
            there is no FP4 GEMM). ``"auto"``: NVFP4 where the device has an FP4 GEMM; elsewhere
            DMPQ's choice would be emulated, slower than INT8, so the conversion runs every call
            at INT8 — the fastest real low-bit GEMM there — and fits no predictor
            (:func:`sixbit.presets.for_device`; the ``balanced`` preset uses it).
    """

    target_bits: float = 6.0
    threshold: float | None = None
    hadamard_block: int | None = 128
    error_at: str = "steps"
    step_groups: int = 5
    block_groups: int = 4
    low: str = "nvfp4"

    def __post_init__(self):
        problems = type_problems(self)
        if self.low not in ("nvfp4", "auto"):
            problems.append(f'low must be "nvfp4" or "auto", got {self.low!r}')
        if not ACT_BITS[ActMode.NVFP4] <= self.target_bits <= ACT_BITS[ActMode.INT8]:
            problems.append(f"target_bits must be within [4.5, 8], got {self.target_bits!r}")
        if self.threshold is not None and not self.threshold >= 0:
            problems.append(f"threshold must be ≥ 0 or None, got {self.threshold!r}")
        if self.error_at not in ("video", "steps", "block"):
            problems.append(f'error_at must be "video", "steps" or "block", got {self.error_at!r}')
        for name in ("step_groups", "block_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be an integer ≥ 1, got {value!r}")
        if problems:
            raise ValueError(report("invalid DMPQConfig", problems))
