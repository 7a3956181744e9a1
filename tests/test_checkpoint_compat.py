"""Checkpoints written before the method registry load bit-exactly (tests/fixtures/legacy_checkpoints.py).

Each stored file is loaded into a freshly built tiny CogVideoX with today's code; the sampled
latents must equal the ones stored when the file was written (bit for bit on a CPU of the
writer's kind, within 2e-3 on others), and the runtime methods the file names must be installed
again.
"""

import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file

import sixbit
from sixbit.kernels import cpu_kind
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


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_checkpoint_written_before_loads_bit_exactly(name):
    tm = build()
    before = sample(tm, STEPS)
    sixbit.load(OUT / f"{name}.safetensors", tm.model, layout="compact")  # the file's numerics, on any CPU
    conversion = sixbit.conversion_of(tm.model)
    assert conversion is not None and conversion.config == cases()[name][0]
    for attribute in METHODS[name]:
        assert getattr(conversion, attribute) is not None, attribute
    expected = load_file(str(OUT / f"{name}.out.safetensors"))["latents"]
    got = sample(tm, STEPS)
    assert not torch.equal(got, before)  # the conversion changed the model …
    if json.loads((OUT / "written_by.json").read_text()).get("cpu_kind") == cpu_kind():
        assert torch.equal(got, expected)  # … exactly as it did when the file was written
    else:  # another kind of CPU rounds its matmuls differently: measured ≤ 4e-4 on latents of ~3
        assert torch.allclose(got, expected, rtol=0, atol=2e-3)
