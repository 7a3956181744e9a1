import re

import pytest
import torch
from torch import nn

import sixbit
from sixbit.config import Role
from sixbit.models import iter_blocks, register_model, registered, spec_for, ModelSpec
from fixtures.tiny_models import EVERY_BUILDER, build_tiny

# A few layers per architecture whose role the metadata must get right.
EXPECTED = {
    "cogvideox": {"transformer_blocks.0.attn1.to_q": Role.ATTENTION, "transformer_blocks.1.ff.net.2": Role.FEEDFORWARD,
                  "transformer_blocks.0.norm1.linear": Role.MODULATION, "time_embedding.linear_1": Role.EMBEDDING,
                  "patch_embed.text_proj": Role.EMBEDDING, "norm_out.linear": Role.OUTPUT, "proj_out": Role.OUTPUT},
    "wan": {"blocks.0.attn2.to_k": Role.ATTENTION, "blocks.1.ffn.net.0.proj": Role.FEEDFORWARD,
            "condition_embedder.text_embedder.linear_1": Role.EMBEDDING, "proj_out": Role.OUTPUT},
    "hunyuanvideo": {"transformer_blocks.0.attn.add_q_proj": Role.ATTENTION, "transformer_blocks.0.attn.to_add_out": Role.ATTENTION,
                     "transformer_blocks.1.ff_context.net.2": Role.FEEDFORWARD, "single_transformer_blocks.0.proj_mlp": Role.FEEDFORWARD,
                     "single_transformer_blocks.1.proj_out": Role.FEEDFORWARD, "single_transformer_blocks.0.norm.linear": Role.MODULATION,
                     "transformer_blocks.0.norm1_context.linear": Role.MODULATION,
                     "context_embedder.token_refiner.refiner_blocks.0.attn.to_q": Role.EMBEDDING, "proj_out": Role.OUTPUT},
    "ltx": {"transformer_blocks.0.attn2.to_out.0": Role.ATTENTION, "proj_in": Role.EMBEDDING, "caption_projection.linear_1": Role.EMBEDDING},
    "mochi": {"transformer_blocks.0.attn1.add_k_proj": Role.ATTENTION, "transformer_blocks.1.norm1_context.linear_1": Role.MODULATION,
              "time_embed.pooler.to_q": Role.EMBEDDING, "transformer_blocks.0.ff_context.net.0.proj": Role.FEEDFORWARD},
    "allegro": {"adaln_single.linear": Role.EMBEDDING, "transformer_blocks.0.attn2.to_v": Role.ATTENTION},
    "latte": {"temporal_transformer_blocks.1.attn1.to_q": Role.ATTENTION, "temporal_transformer_blocks.0.ff.net.2": Role.FEEDFORWARD},
}


# Models whose blocks the generic fallback finds (video stream first, returned alone, every
# linear named by DEFAULT_ROLES); all others are registered in sixbit/models/diffusers_models.py.
GENERIC = {"anyflow", "anyflow-far", "chronoedit", "cosmos", "helios", "sana-video", "skyreels-v2"}


@pytest.mark.parametrize("name", sorted(EVERY_BUILDER))
def test_every_linear_has_a_role(name):
    tm = build_tiny(name)
    spec = spec_for(tm.model)
    assert (spec.name == "generic") == (name in GENERIC) and spec.block_lists == tm.block_lists
    roles = {n: spec.role_of(n) for n, m in tm.model.named_modules() if isinstance(m, nn.Linear)}
    for layer, role in EXPECTED.get(name.removesuffix("1.5"), {}).items():
        assert roles[layer] is role, layer
    # OTHER (never quantized) is kept for layers a model builds but never runs (SANA-WM's
    # refiner keeps LTX-2's audio layers so checkpoints load): no calibration would see them
    called = set()
    for n, m in tm.model.named_modules():
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(lambda module, args, n=n: called.add(n))
    with torch.no_grad():
        tm.model(**tm.inputs(2))
    other = {n for n, r in roles.items() if r is Role.OTHER}
    assert not other & called, sorted(other & called)
    # every linear inside a block that runs is quantizable or deliberately full precision
    blocks = {block_name for _, block_name, _, _ in iter_blocks(tm.model)}
    in_blocks = {n for n in called if any(n.startswith(b + ".") for b in blocks)}
    assert {roles[n] for n in in_blocks} & {Role.ATTENTION, Role.FEEDFORWARD}


@pytest.mark.parametrize("name", sorted(EVERY_BUILDER))
def test_block_io_matches_the_real_calls(name):
    """Each block's metadata names streams that go in and come out with the same shape, and the
    outputs it lists are what the block returns (a bare tensor, or a tuple in that order)."""
    tm = build_tiny(name)
    kwargs = tm.inputs(2)  # before the hooks: a reference pass (Wan-Animate-2) calls the blocks
    seen = []

    def hook(module, args, kw, out, io):
        arity = len(out) if isinstance(out, (tuple, list)) else 1
        assert arity == len(io.returns) and (arity > 1) == isinstance(out, (tuple, list)), (type(out), io.returns)
        for stream in ("hidden", "encoder") if io.encoder is not None else ("hidden",):
            x, y = io.stream_input(module, args, kw, stream), io.stream_output(out, stream)
            assert (x is None) == (y is None), stream  # e.g. Kandinsky 6 without audio: neither
            if x is not None:
                seen.append(stream)
                assert x.shape == y.shape, (stream, x.shape, y.shape)  # a residual stream keeps its shape

    for _, _, block, io in iter_blocks(tm.model):
        block.register_forward_hook(lambda m, a, kw, out, io=io: hook(m, a, kw, out, io), with_kwargs=True)
    with torch.no_grad():
        tm.model(**kwargs)
    ios = [io for _, _, _, io in iter_blocks(tm.model)]
    assert seen.count("hidden") == len(ios)
    assert seen.count("encoder") == sum(io.encoder is not None for io in ios)


def test_latte_blocks_are_interleaved():
    order = [(i, n) for i, n, _, _ in iter_blocks(build_tiny("latte").model)]
    assert order == [(0, "transformer_blocks.0"), (1, "temporal_transformer_blocks.0"),
                     (2, "transformer_blocks.1"), (3, "temporal_transformer_blocks.1")]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return x + self.fc(x)


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(16, 16)
        self.layers = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.ModuleList([nn.Linear(16, 4)])


def test_generic_fallback_and_unrecognized_model():
    spec = spec_for(Custom())
    assert spec.name == "generic" and spec.block_lists == ("layers",)
    with pytest.raises(ValueError, match="register_model"):
        spec_for(nn.Sequential(nn.Linear(4, 4)))


class Attention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.to_q = nn.Linear(dim, dim)

    def forward(self, x):
        return self.to_q(x)


class StreamBlock(nn.Module):
    """A transformer block whose video stream is not called ``hidden_states``."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.attn = Attention(64)

    def forward(self, visual_embed, temb):
        return visual_embed + self.attn(self.norm(visual_embed)) * temb


class Decoy(nn.Module):
    """Many parameters (an embedding table), few linear weights."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(2000, 64)
        self.attn = Attention(16)


class TwoLists(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoys = nn.ModuleList(Decoy() for _ in range(2))
        self.blocks = nn.ModuleList(StreamBlock() for _ in range(2))

    def forward(self, x, timestep):
        for block in self.blocks:
            x = block(x, timestep.reshape(-1, 1, 1) / 1000)
        return x


def test_generic_fallback_finds_the_same_blocks_after_quantization():
    model = TwoLists()
    before = spec_for(model)
    assert before.name == "generic" and before.block_lists == ("blocks",)
    assert before.block_io[0].hidden == "visual_embed"  # the blocks' first argument
    # more parameters live in the decoys, more linear weights in the blocks
    assert sum(p.numel() for p in model.decoys.parameters()) > sum(p.numel() for p in model.blocks.parameters())
    sixbit.quantize(model, sixbit.QuantConfig(weight_format="int8"))
    assert not any(isinstance(m, nn.Linear) for m in model.blocks.modules())  # only QuantLinear left in the blocks
    after = spec_for(model)
    assert after == before
    assert [name for _, name, _, _ in iter_blocks(model)] == ["blocks.0", "blocks.1"]
    # the runtime methods find and remove their hooks on the quantized generic model
    x, t = torch.randn(1, 4, 64), torch.tensor([500.0])
    cache = sixbit.enable_delta_cache(model)
    with torch.no_grad():
        model(x, timestep=t)
    assert cache.report().decisions == {("cond", 0, 0): "compute", ("cond", 0, 1): "compute"}
    sixbit.disable_delta_cache(model)
    assert all(getattr(b, "_diffusers_hook", None) is None or b._diffusers_hook.get_hook("sixbit_delta_cache") is None
               for b in model.blocks)


def test_registration_rules():
    assert "CogVideoXTransformer3DModel" in registered()
    with pytest.raises(ValueError, match="already registered"):
        register_model(ModelSpec("again", ("CogVideoXTransformer3DModel",), ("transformer_blocks",)))
    assert re.fullmatch(r"[a-z0-9.-]+", spec_for(build_tiny("ltx").model).name)
