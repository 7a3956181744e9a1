"""Checkpoints written before the method registry load bit-exactly (tests/fixtures/legacy_checkpoints.py).

Each stored file is loaded into a freshly built tiny CogVideoX with today's code; the sampled
latents must equal the ones stored when the file was written (bit for bit on a CPU of the
writer's kind, within 2e-3 on others once DMPQ's calls on its threshold go either way: see TIE),
the state loaded must be the file's, tensor for tensor, and the runtime methods the file names
must be installed again.
"""

import itertools
import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file

import sixbit
from sixbit.kernels import cpu_kind
from sixbit.methods.dmpq.method import DMPQPredictor
from sixbit.nn.precision import ActMode
from fixtures.legacy_checkpoints import OUT, STEPS, build, cases
from fixtures.tiny_base import sample

METHODS = {  # what each case must bring back, as Conversion attributes
    "w8a8": (),
    "w4a8_rtn_stabilized": ("stabilizer",),
    "balanced": ("predictor", "dmpq", "cache"),
    "w8a8_static": (),
    "int8_attention": ("attention",),
    "tdc": ("cache",),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the files' latents were sampled with one thread
    yield
    torch.set_num_threads(threads)


def test_every_case_has_a_stored_file():
    assert set(cases()) == set(METHODS)
    assert json.loads((OUT / "written_by.json").read_text())["steps"] == STEPS
    for name in METHODS:
        assert (OUT / f"{name}.safetensors").is_file() and (OUT / f"{name}.out.safetensors").is_file()


# DMPQ's predicted error for a block call can sit on its threshold to the last fp32 bits (the
# threshold is a quantile of the calibration's predictions, and these are the calibration's inputs):
# such a call's precision is decided by how this CPU kind rounds. Measured: balanced's
# (cond, step 2, block 0) predicted 7.6828112e-06 against 7.6828120e-06 (1e-7 relative) on an AMD
# EPYC with AVX512-BF16/VNNI and no AMX: NVFP4 there, INT8 on the AMX writer; that one call moved
# the latents by up to 2.65e-2 (4.6e-3 of their norm), and taken as INT8 left 8.3e-7.
TIE = 1e-5
# Other roundings of the same calls (fp32 GEMMs blocked differently, bf16 ones on AMX or not),
# measured against the AMX writer on that EPYC and under ONEDNN_MAX_CPU_ISA=AVX2
# ATEN_CPU_CAPABILITY=avx2: at most 4.2e-4 (int8_attention; the others ≤ 6e-5) on latents of ~3.
ATOL = 2e-3


def _choices(conversion, flip=frozenset()) -> list[float]:
    """Each DMPQ call's |predicted error / threshold − 1|, recorded as the calls run (none without a
    predictor); the calls numbered in ``flip`` take the other precision."""
    policy = getattr(conversion.dmpq, "policy", None)
    margins: list[float] = []
    if not isinstance(policy, DMPQPredictor):
        return margins
    choose = policy.choose

    def recorded(block, gamma, step=0):
        mode = choose(block, gamma, step)
        margins.append(abs(float(policy.predict(block, gamma, step).max()) / policy.threshold - 1))
        if len(margins) - 1 in flip:
            return ActMode.INT8 if mode is ActMode.NVFP4 else ActMode.NVFP4
        return mode

    policy.choose = recorded
    return margins


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_checkpoint_written_before_loads_bit_exactly(name, tmp_path):
    tm = build()
    before = sample(tm, STEPS)
    file = OUT / f"{name}.safetensors"
    sixbit.load(file, tm.model, layout="compact")  # the file's numerics, on any CPU
    conversion = sixbit.conversion_of(tm.model)
    assert conversion is not None and conversion.config == cases()[name][0]
    for attribute in METHODS[name]:
        assert getattr(conversion, attribute) is not None, attribute
    stored, again = load_file(str(file)), load_file(str(sixbit.save(tm.model, tmp_path / "again.safetensors")))
    assert again.keys() == stored.keys() and all(torch.equal(again[k], stored[k]) for k in stored)  # on any CPU
    expected = load_file(str(OUT / f"{name}.out.safetensors"))["latents"]
    margins = _choices(conversion)
    got = sample(tm, STEPS)
    assert not torch.equal(got, before)  # the conversion changed the model …
    if json.loads((OUT / "written_by.json").read_text()).get("cpu_kind") == cpu_kind():
        assert torch.equal(got, expected)  # … exactly as it did when the file was written
        return
    ties = [i for i, margin in enumerate(margins) if margin < TIE]  # decided by this CPU kind's rounding
    assert len(ties) <= 3
    runs = [got]
    for flip in itertools.chain.from_iterable(itertools.combinations(ties, n) for n in range(1, len(ties) + 1)):
        again = build()
        sixbit.load(file, again.model, layout="compact")
        _choices(sixbit.conversion_of(again.model), frozenset(flip))
        runs.append(sample(again, STEPS))
    closest = min(runs, key=lambda run: float((run - expected).abs().max()))
    assert torch.allclose(closest, expected, rtol=0, atol=ATOL)  # … up to how another CPU kind rounds
