"""Pricing with the block's computation before each priced layer reused (:mod:`sixbit.tuning.prefix`)
gives the errors of full replays, bit for bit, and skips work."""

from __future__ import annotations

import pytest
from fixtures.tiny_base import sample
from fixtures.tiny_models import build_tiny

from sixbit import ConvertConfig, QuantConfig
from sixbit.tuning import blocks
from sixbit.tuning.prefix import Prefix

BASE = ConvertConfig(weights=QuantConfig(weight_format="int4-g16", gptq=True, scale_rule="mse"), activations="int8")


@pytest.mark.parametrize("name", ["cogvideox", "wan"])
def test_reused_prefixes_price_as_full_replays(name, monkeypatch):
    tm = build_tiny(name)
    run = lambda: sample(tm, steps=2)  # noqa: E731
    reused_calls = []
    real = Prefix.reused

    def counted(self, layer):
        reused_calls.append(len(self.reuse.get(layer, ())))
        return real(self, layer)

    monkeypatch.setattr(Prefix, "reused", counted)
    reusing = blocks.price_blocks(tm.model, BASE, ("int4-g16", "int8", None), run, progress=False)
    monkeypatch.setattr(blocks, "REUSE_PREFIX", False)
    replayed = blocks.price_blocks(tm.model, BASE, ("int4-g16", "int8", None), run, progress=False)
    assert reusing.errors == replayed.errors and reusing.proxies == replayed.proxies
    assert max(reused_calls) > 0  # the later layers of each block took recorded calls
    assert min(e for row in reusing.errors for e in row if e > 0) > 0
