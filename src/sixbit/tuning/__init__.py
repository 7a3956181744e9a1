"""Per-layer weight formats tuned to a size or quality target (seed 000 §2.1's stages 1 and 2).

Users think in targets, not formats: "as small as possible at 35 dB", "the best video in 5 bits
per weight". :func:`tune` finds a per-layer format map for one of those and returns a
:class:`~sixbit.presets.ConvertConfig` that :func:`sixbit.convert_model` takes unchanged (its
``weights.layer_formats``):

1. **sensitivity**: what every attention and feed-forward linear costs the calibration videos in
   each candidate format. By default (``sensitivity="blocks"``, :mod:`.blocks`) priced on block
   inputs kept from one calibration run: each candidate's block-output error (one replay of its
   block with that layer swapped in), mapped to video error by a factor fitted on a few whole
   generations. With ``sensitivity="generation"`` (:mod:`.sensitivity`) each layer and format is
   measured with a whole calibration generation: exact, about 5× slower on the shipped models. Beside either, a cheap
   proxy (output error energy on the calibration inputs) and its rank correlation;
2. **search** (:mod:`.search`): a greedy assignment from that ranking seeds a genetic search
   whose fitness is the calibration PSNR: predicted under ``"blocks"`` (the pick then checked with
   whole generations; a ``min_psnr`` pick that misses is searched again with the target raised by
   the shortfall, :data:`~.tuner.CHECK_ROUNDS` rounds at most), measured under ``"generation"``.
   The candidates are built once, GPTQ on the full-precision model's inputs, and the base
   config's other quantized layers (modulation) are swapped in with them, so ``convert_model``
   with ``calibration_inputs="full_precision"`` builds exactly the model the checks ran. The pick
   (and under ``"generation"`` the greedy one) is also converted for real with
   ``convert_model``'s default, GPTQ on the quantized blocks' outputs, and the tuned config takes
   whichever of the two calibrates better (on the shipped models they differ by up to ±1.5 dB,
   one way on one model, the other way on the other): the PSNR
   reported is the converted model's either way. A ``min_psnr`` target is checked
   against the calibration videos' mean PSNR minus one standard error
   (:func:`~sixbit.calibration.quality.psnr_bound`), a margin for prompts the tuning has not seen;
3. **refinement** happens at conversion, not here: the base recipe's ``refine_steps``
   (:mod:`sixbit.rounding.refine`: the low-rank branches fitted block by block to the
   full-precision outputs) is kept in the tuned config and runs in ``convert_model`` (off in
   the presets; with it the converted model is no longer exactly the measured one).

The weight recipe (Hadamard rotation, scale search, GPTQ, low-rank branch) and the activations
come from a base config (default the ``w4a8`` preset: per-token INT8 activations, a real integer
GEMM on CPUs and GPUs). The model is left as it was given: candidates are swapped in and out.
Cost under ``"blocks"``: one calibration run (the kept inputs), one block replay per layer and
format, about a dozen runs (the fit, the pick's checks and its conversion) — about 5 minutes on
the shipped models on a shared 2-core CPU. Under ``"generation"``: one calibration run per block (input statistics), one per
layer and format, one per assignment the search measures, and a conversion plus a run for the
pick and for the greedy assignment — tens of minutes on the shipped models
(BENCHMARKS.md ``tune-blocks``).

A transformer too large to hold in memory is tuned from its files, one block in memory at a
time: :func:`sixbit.tune_pretrained` (:mod:`sixbit.streaming`), which prices as above.

Example:
    >>> import sixbit
    >>> from sixbit.zoo.shapes import all_prompts, load_pipeline
    >>> pipe = load_pipeline("cogvideox")
    >>> config = sixbit.tune(pipe, all_prompts()[:4], min_psnr=35,
    ...                      calibration_kwargs={"num_inference_steps": 10})   # doctest: +SKIP
    >>> sixbit.convert_model(pipe, all_prompts()[:4], config)                  # doctest: +SKIP
"""

from .report import TuneReport
from .tuner import (
    DEFAULT_FORMATS,
    Constraint,
    Tuner,
    tune,
    tune_model,
)

__all__ = ["DEFAULT_FORMATS", "Constraint", "TuneReport", "Tuner", "tune", "tune_model"]
