"""Per-layer weight formats tuned to a size or quality target (seed 000 §2.1's stages 1 and 2).

Users think in targets, not formats: "as small as possible at 35 dB", "the best video in 5 bits
per weight". :func:`tune` finds a per-layer format map for one of those and returns a
:class:`~sixbit.presets.ConvertConfig` that :func:`sixbit.convert_model` takes unchanged (its
``weights.layer_formats``):

1. **sensitivity** (:mod:`.sensitivity`): every attention and feed-forward linear quantized alone
   to each candidate format, the calibration videos generated and compared with full precision;
   plus a cheap proxy (output error energy on the calibration inputs) and its rank correlation;
2. **search** (:mod:`.search`): a greedy assignment from that ranking seeds a genetic search
   whose fitness is the measured calibration PSNR. The candidates are built once, GPTQ on the
   full-precision model's inputs, and the base config's other quantized layers (modulation) are
   swapped in with them, so ``convert_model`` with ``calibration_inputs="full_precision"``
   builds exactly the model the search ran. Its pick (and the greedy one) is then also
   converted for real with ``convert_model``'s default, GPTQ on the quantized blocks' outputs,
   and the tuned config takes whichever of the two calibrates better (on the shipped models
   they differ by up to ±1.5 dB, one way on one model, the other way on the other): the PSNR
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
Cost: one calibration run per block (input statistics), one per layer and format (sensitivity),
one per assignment the search measures, and a conversion plus a run for the pick and for the
greedy assignment — minutes on the shipped models.

Example:
    >>> import sixbit
    >>> from sixbit.zoo.shapes import all_prompts, load_pipeline
    >>> pipe = load_pipeline("cogvideox")
    >>> config = sixbit.tune(pipe, all_prompts()[:4], min_psnr=35,
    ...                      calibration_kwargs={"num_inference_steps": 10})   # doctest: +SKIP
    >>> sixbit.convert_model(pipe, all_prompts()[:4], config)                  # doctest: +SKIP
"""

from .tuner import (
    DEFAULT_FORMATS,
    Constraint,
    TuneReport,
    Tuner,
    tune,
    tune_model,
)

__all__ = ["DEFAULT_FORMATS", "Constraint", "TuneReport", "Tuner", "tune", "tune_model"]
