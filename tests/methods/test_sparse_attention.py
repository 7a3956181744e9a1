"""Sparse attention: block tables over the token grid, the flex kernel against its reference twin,
and the method (fixed budget, adaptive fallback, warm-up) on the shipped models."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sixbit.methods.sparse_attention.method as sparse_method
from sixbit.kernels.block_sparse import (
    block_sparse_attention,
    block_sparse_reference,
    token_mask,
)
from sixbit.methods.attention import (
    AttentionQuantConfig,
    apply_attention_quant,
    remove_attention_quant,
)
from sixbit.methods.sparse_attention import (
    SparseAttentionConfig,
    TokenGrid,
    apply_sparse_attention,
    ladder,
    remove_sparse_attention,
    sparse_attention_of,
    window_table,
)
from sixbit.methods.sparse_attention.mask import tile_order
from sixbit.zoo.shapes import load_pipeline

BLOCK = 32  # the shipped models have 256 video tokens (4 latent frames of 8×8): blocks of 32 keep a few per frame


def _places(grid: TokenGrid):
    """(frame, row, column) of every token, or None for text."""
    places = [None] * grid.text if grid.text_first else []
    places += [(f, r, c) for f in range(grid.frames) for r in range(grid.rows) for c in range(grid.cols)]
    return places + ([] if grid.text_first else [None] * grid.text)


@pytest.mark.parametrize("tiles", [False, True])
@pytest.mark.parametrize("grid", [TokenGrid(4, 8, 8, 10, True), TokenGrid(3, 5, 6, 7, False), TokenGrid(3, 4, 4)])
def test_a_table_keeps_every_token_pair_within_its_window_and_text_everywhere(grid, tiles):
    window = (1, 2, 1)
    order = tile_order(grid, 16) if tiles else torch.arange(grid.tokens)
    table = window_table(grid, 16, window, 1, order if tiles else None)
    keep = torch.zeros(grid.tokens, grid.tokens, dtype=torch.bool)
    keep[order[:, None], order[None, :]] = token_mask(table[None], grid.tokens, 16)[0]  # back to the model's order
    places = _places(grid)
    first_video = next(i for i, p in enumerate(places) if p is not None)
    for i, p in enumerate(places):
        for j, r in enumerate(places):
            if p is None or r is None or all(abs(a - b) <= w for a, b, w in zip(p, r, window)):
                assert keep[i, j], (i, j)  # within the window, or text: never dropped
    assert keep[:, order[first_video // 16 * 16]].all()  # the global block: seen by every query
    assert 0 < table.float().mean() < 1


def test_the_tile_order_makes_blocks_compact_patches():
    grid = TokenGrid(2, 12, 20, 5, True)
    order = tile_order(grid, 32)  # tiles of 4 rows × 8 columns
    assert sorted(order.tolist()) == list(range(grid.tokens)) and order[-5:].tolist() == [0, 1, 2, 3, 4]  # text last
    first = [(int(t) - 5) // 20 % 12 for t in order[:32]], [(int(t) - 5) % 20 for t in order[:32]]
    assert set(first[0]) == {0, 1, 2, 3} and set(first[1]) == set(range(8))  # the first block: one 4×8 patch
    # the second block starts at row 4 of the first band: still a 4×8 patch, wherever the band ends
    second = {((int(t) - 5) // 20 % 12, (int(t) - 5) % 20) for t in order[32:64]}
    assert second == {(r, c) for r in range(4, 8) for c in range(8)}


def test_a_ladder_grows_to_dense():
    grid = TokenGrid(13, 30, 45, 226)
    rungs = ladder(grid, 128, 1, tile_order(grid, 128))
    densities = [r.density for r in rungs]
    assert densities == sorted(densities) and densities[-1] == 1.0 and densities[0] < 0.1
    assert all(not torch.equal(a.table, b.table) for a, b in itertools.pairwise(rungs))  # each table once


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)])
def test_flex_kernel_matches_its_reference_twin(dtype, atol):
    # 266 tokens: not a multiple of the block size (the last block is partial)
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 266, 48, dtype=dtype) for _ in range(3))
    table = window_table(TokenGrid(4, 8, 8, 10), BLOCK, (0, 1, 1), 1).expand(3, -1, -1).clone()
    table[1] = True  # one head dense, one with an extra random pattern
    table[2] |= torch.rand(table.shape[1:]) < 0.3
    reference = block_sparse_reference(q.float(), k.float(), v.float(), table, BLOCK)
    out = block_sparse_attention(q, k, v, table, BLOCK)
    assert out.dtype == dtype
    # float32: summation order only; bfloat16: the kernel's bf16 products against an fp32 reference
    torch.testing.assert_close(out.float(), reference, rtol=0, atol=atol)
    torch.testing.assert_close(reference[:, 1], F.scaled_dot_product_attention(q.float(), k.float(), v.float())[:, 1])


def _generate(pipe, steps=3):
    return pipe("a red circle moving right", num_inference_steps=steps, generator=torch.Generator().manual_seed(3)).frames


@pytest.fixture(scope="module")
def wan():
    pipe = load_pipeline("wan")
    return pipe, _generate(pipe)


@pytest.fixture(scope="module")
def cogvideox():
    pipe = load_pipeline("cogvideox")
    return pipe, _generate(pipe)


@pytest.mark.parametrize("arch", ["wan", "cogvideox"])
def test_a_dense_budget_is_bit_identical_to_no_method(arch, request):
    pipe, reference = request.getfixturevalue(arch)
    state = apply_sparse_attention(pipe.transformer, SparseAttentionConfig(density=1.0, block_size=BLOCK, warmup_steps=0))
    assert np.array_equal(_generate(pipe), reference)
    assert state.dense_calls > 0 and state.sparse_calls == 0 and state.achieved_density == 1.0
    remove_sparse_attention(pipe.transformer)
    assert sparse_attention_of(pipe.transformer) is None


@pytest.mark.parametrize("arch", ["wan", "cogvideox"])
def test_a_fixed_budget_runs_sparse_after_the_warm_up_and_matches_the_reference_twin(arch, request, monkeypatch):
    pipe, reference = request.getfixturevalue(arch)
    config = SparseAttentionConfig(density=0.5, block_size=BLOCK, warmup_steps=1)
    state = apply_sparse_attention(pipe, config)  # a pipeline is accepted
    video = _generate(pipe)
    assert state.sparse_calls > 0 and state.warmup_calls > 0 and state.dense_calls == 0
    # within the budget, or the smallest window where that is over it (CogVideoX: 9 blocks, the
    # text block's row and column and the global block kept leave 0.56 at the smallest window)
    assert 0 < state.achieved_density <= (0.5 if arch == "wan" else 0.56)
    # Wan's cross-attention (text keys) stays dense; CogVideoX joins the text to its self-attention
    assert (state.other_calls > 0) == (arch == "wan")
    assert not np.array_equal(video, reference) and np.abs(video - reference).mean() < 0.1
    # the method's flex path against the reference twin (dense SDPA with the explicit mask), one run each
    monkeypatch.setattr(sparse_method, "block_sparse_attention", block_sparse_reference)
    apply_sparse_attention(pipe, config)
    np.testing.assert_allclose(_generate(pipe), video, rtol=0, atol=1e-4)
    # every step inside the warm-up: no sparse call, bit-identical
    state = apply_sparse_attention(pipe, SparseAttentionConfig(density=0.5, block_size=BLOCK, warmup_steps=3))
    assert np.array_equal(_generate(pipe), reference) and state.sparse_calls == 0 and state.warmup_calls > 0
    remove_sparse_attention(pipe)


def test_sdpa_wrapped_by_another_library_still_runs_sparse(wan, monkeypatch):
    """A wrapper put in F.scaled_dot_product_attention's place (a profiler's, a library's patch)
    that calls torch's kernel: the calls still run sparse. They ran dense, silently."""
    pipe, _ = wan
    config = SparseAttentionConfig(density=0.5, block_size=BLOCK, warmup_steps=1)
    state = apply_sparse_attention(pipe, config)
    video = _generate(pipe)
    sdpa, wrapped = F.scaled_dot_product_attention, []
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: wrapped.append(1) or sdpa(*a, **k))
    state.reset()
    assert np.array_equal(_generate(pipe), video) and wrapped and state.sparse_calls > 0
    remove_sparse_attention(pipe)


def test_the_adaptive_mode_widens_heads_past_a_tight_bound_and_keeps_them_under_a_loose_one(wan):
    pipe, reference = wan
    tight = apply_sparse_attention(pipe.transformer, SparseAttentionConfig(
        density=0.3, block_size=BLOCK, warmup_steps=1, error_bound=1e-6))
    assert np.array_equal(_generate(pipe), reference)  # every head went dense: the unhooked SDPA call
    assert tight.dense_heads > 0 and tight.dense_heads == tight.widened_heads and tight.sparse_calls == 0
    fixed = apply_sparse_attention(pipe.transformer, SparseAttentionConfig(density=0.3, block_size=BLOCK, warmup_steps=1))
    budget = _generate(pipe)
    loose = apply_sparse_attention(pipe.transformer, SparseAttentionConfig(
        density=0.3, block_size=BLOCK, warmup_steps=1, error_bound=100.0))
    assert np.array_equal(_generate(pipe), budget)  # nothing widened: the fixed budget's tables
    assert loose.widened_heads == 0 and loose.sparse_calls == fixed.sparse_calls
    middle = apply_sparse_attention(pipe.transformer, SparseAttentionConfig(
        density=0.3, block_size=BLOCK, warmup_steps=1, error_bound=0.05))
    video = _generate(pipe)
    assert 0 < middle.widened_heads and middle.sparse_calls > 0  # some heads widened, some calls stayed sparse
    error = lambda x: np.abs(x - reference).mean()
    assert error(video) < error(budget)
    remove_sparse_attention(pipe.transformer)


def test_sparse_and_quantized_attention_are_refused_together_and_nothing_changes(wan):
    pipe, _ = wan
    apply_attention_quant(pipe.transformer, AttentionQuantConfig())
    with pytest.raises(ValueError, match="both replace the attention kernel.*remove_attention_quant"):
        apply_sparse_attention(pipe.transformer, SparseAttentionConfig())
    assert sparse_attention_of(pipe.transformer) is None
    remove_attention_quant(pipe.transformer)
    state = apply_sparse_attention(pipe.transformer, SparseAttentionConfig())
    with pytest.raises(ValueError, match="both replace the attention kernel.*remove_sparse_attention"):
        apply_attention_quant(pipe.transformer, AttentionQuantConfig())
    assert sparse_attention_of(pipe.transformer) is state
    remove_sparse_attention(pipe.transformer)


def test_the_config_is_checked():
    with pytest.raises(ValueError, match="exactly one"):
        SparseAttentionConfig(density=0.2, window=(1, 2, 2))
    with pytest.raises(ValueError, match=r"density must be within \(0, 1\]"):
        SparseAttentionConfig(density=1.5)
    with pytest.raises(ValueError, match="multiple of 16"):
        SparseAttentionConfig(block_size=40)
    with pytest.raises(ValueError, match="error_bound"):
        SparseAttentionConfig(error_bound=0)
    assert SparseAttentionConfig.from_dict(SparseAttentionConfig(window=(1, 2, 3), density=None).to_dict()).window == (1, 2, 3)


def _w8a8_sparse(**sparse):
    import sixbit

    return sixbit.ConvertConfig(weights=sixbit.QuantConfig(weight_format="int8"), activations="int8",
                                methods=(SparseAttentionConfig(block_size=BLOCK, warmup_steps=1, **sparse),))


def test_a_w8a8_conversion_with_sparse_attention_is_summarized_saved_loaded_and_described(tmp_path, capsys):
    import sixbit
    from sixbit.cli import main

    pipe = load_pipeline("wan")
    sixbit.convert_model(pipe, None, _w8a8_sparse(density=0.5))
    plain = load_pipeline("wan")
    sixbit.convert_model(plain, None, sixbit.ConvertConfig(weights=sixbit.QuantConfig(weight_format="int8"),
                                                           activations="int8"))
    video = _generate(pipe)
    state = sparse_attention_of(pipe)
    assert state.sparse_calls > 0 and not np.array_equal(video, _generate(plain))  # both methods ran
    note = next(n for n in sixbit.summary(pipe).notes if n.startswith("sparse attention"))
    assert note.startswith("sparse attention (density 0.5, dense for step 0, blocks of 32; flex_attention compiled for "
                           "cpu): 16 sparse, 0 dense past the warm-up, 8 warm-up, 24 other")
    assert "achieved density 0.34" in note
    path = tmp_path / "m.safetensors"
    sixbit.save(pipe, path)
    fresh = sixbit.load(path, load_pipeline("wan"))
    loaded = sparse_attention_of(fresh)
    assert loaded is not None and loaded.config == state.config
    assert np.array_equal(_generate(fresh), video) and loaded.sparse_calls == state.sparse_calls
    capsys.readouterr()
    assert main(["info", str(path)]) == 0
    assert "runtime method sparse_attention: density 0.5, dense for step 0, blocks of 32" in capsys.readouterr().out
    # removed after the conversion: saved as it runs (without it)
    remove_sparse_attention(pipe)
    sixbit.save(pipe, path)
    assert sparse_attention_of(sixbit.load(path, load_pipeline("wan"))) is None


def test_a_conversion_selecting_sparse_and_quantized_attention_is_refused_before_anything_changes():
    import sixbit

    pipe = load_pipeline("wan")
    config = sixbit.ConvertConfig(weights=sixbit.QuantConfig(weight_format="int8"), activations="int8",
                                  attention=AttentionQuantConfig(), methods=(SparseAttentionConfig(),))
    with pytest.raises(ValueError, match="both replace the attention kernel"):
        sixbit.convert_model(pipe, None, config)
    assert sixbit.conversion_of(pipe) is None and sparse_attention_of(pipe) is None
    assert not any(isinstance(m, sixbit.QuantLinear) for m in pipe.transformer.modules())


def test_sparse_attention_with_the_delta_cache(cogvideox):
    import sixbit

    pipe, reference = cogvideox
    cache = sixbit.enable_delta_cache(pipe.transformer, sixbit.DeltaCacheConfig(threshold=10.0, error_budget=100.0,
                                                                                warmup_fraction=0.0))
    state = apply_sparse_attention(pipe.transformer, SparseAttentionConfig(density=0.5, block_size=BLOCK, warmup_steps=1))
    video = _generate(pipe, steps=5)
    assert cache.report().skip_share > 0 and state.sparse_calls > 0  # both acted
    # skipped blocks run no attention: 5 steps × 4 blocks, less the skips, less the warm-up step's 4
    computed = list(cache.report().decisions.values()).count("compute")
    assert state.sparse_calls + state.warmup_calls == computed
    # a sanity bound: density 0.5 in blocks of 4 rows of an 8×8 frame, on top of a cache that skips all it may
    assert np.abs(video - _generate_dense_cached(pipe)).mean() < 0.25
    sixbit.disable_delta_cache(pipe.transformer)
    remove_sparse_attention(pipe.transformer)
    assert np.array_equal(_generate(pipe), reference)


def _generate_dense_cached(pipe):
    remove_sparse_attention(pipe.transformer)
    return _generate(pipe, steps=5)


def test_sparse_attention_with_a_sixbit_lora(tmp_path):
    import sixbit
    from tests.test_lora import _peft_lora

    pipe = load_pipeline("cogvideox")
    path = _peft_lora(pipe.transformer, tmp_path)
    sixbit.convert_model(pipe, None, _w8a8_sparse(density=0.5))
    before = _generate(pipe)
    pipe.transformer.load_lora_adapter(tmp_path, weight_name=path.name, prefix=None, adapter_name="x")
    state = sparse_attention_of(pipe)
    state.reset()
    with_lora = _generate(pipe)
    assert sixbit.loras(pipe) == ["x"] and state.sparse_calls > 0 and not np.array_equal(with_lora, before)
    sixbit.unload_lora(pipe)
    assert np.array_equal(_generate(pipe), before)


def test_sequence_parallel_is_refused_with_the_way_that_works(wan):
    from sixbit.parallel import sequence

    pipe, _ = wan
    apply_sparse_attention(pipe.transformer, SparseAttentionConfig())
    with pytest.raises(ValueError, match="does not follow a sequence split yet: convert without the runtime method "
                                         "'sparse_attention', or use mode='tensor'"):
        sequence.check(pipe.transformer, 1)
    remove_sparse_attention(pipe.transformer)


def test_the_w8a8_sparse_preset_stacks_the_cache_and_adaptive_sparse_attention():
    import sixbit

    pipe = load_pipeline("cogvideox")
    sixbit.convert_model(pipe, None, "w8a8-sparse")
    conversion = sixbit.conversion_of(pipe)
    state = sparse_attention_of(pipe)
    assert conversion.cache is not None and state is conversion.methods["sparse_attention"]
    assert state.config == SparseAttentionConfig(density=0.15, error_bound=0.05)
    assert conversion.config.activations == "int8" and conversion.config.weights.weight_format == "int8"
    _generate(pipe, steps=4)
    # 266 tokens fit in 3 blocks of 128: the tables there keep ≥ 90 %, so every call past the warm-up runs dense SDPA
    assert state.warmup_calls > 0 and state.dense_calls > 0 and state.sparse_calls == 0


def test_sparse_attention_under_torch_compile(wan):
    """Dynamo traces the transformer around its attention modules: each runs outside the graph, one
    designed break (``torch.compiler.disable``: the table is chosen per call), with the same output."""
    import torch._dynamo as dynamo

    pipe, _ = wan
    model = pipe.transformer
    state = apply_sparse_attention(model, SparseAttentionConfig(density=0.5, block_size=BLOCK, warmup_steps=1))
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(1, 3, 8, 32, 32, generator=g), torch.randn(1, 10, model.config.text_dim, generator=g)

    def loop(m):
        with torch.no_grad():
            return torch.stack([m(hidden_states=x, timestep=torch.tensor([t]), encoder_hidden_states=text).sample
                                for t in (900, 600, 300)])

    eager = loop(model)
    calls = state.sparse_calls
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = loop(torch.compile(model, backend="eager"))
    assert torch.equal(compiled, eager) and calls > 0 and state.sparse_calls == 2 * calls
    reasons = dict(dynamo.utils.counters["graph_break"])
    assert reasons and all("torch.compiler.disable" in r for r in reasons), list(reasons)
    remove_sparse_attention(model)


# Where the self-attention runs over the placed grid; elsewhere every call is left to SDPA and
# counted as "other" (as measured): HunyuanVideo and HunyuanVideo-1.5 pass an attention mask
# (text padding); JoyImage, Mochi and HunyuanVideo-1.5 join text that no ModelSpec.text_tokens
# places; Sana-WM's SDPA calls are cross-attention (with a mask).
PLACED = {"allegro", "cogvideox", "cogvideox1.5", "consisid", "easyanimate", "motif-video", "wan", "wan-vace"}


@pytest.mark.parametrize("name", sorted(PLACED | {"hunyuanvideo", "hunyuanvideo-1.5", "joyimage-edit", "mochi",
                                                   "sana-wm"}))
def test_every_architecture_with_a_grid_runs_or_leaves_its_attention_to_sdpa(name):
    from fixtures.tiny_models import build_tiny, sample

    tm = build_tiny(name)
    state = apply_sparse_attention(tm.model, SparseAttentionConfig(window=(0, 0, 0), density=None, block_size=16,
                                                                   warmup_steps=0, global_blocks=0))
    assert torch.isfinite(sample(tm, 2)).all()
    placed = state.sparse_calls + state.dense_calls
    assert (placed > 0) == (name in PLACED) and (state.other_calls > 0 or placed > 0)


def test_the_preset_streamed_into_a_diffusers_folder_is_restored_on_load(tmp_path):
    import sixbit
    from sixbit.pipelines import load_pipeline as load_folder
    from sixbit.zoo.shapes import WEIGHTS_DIR

    sixbit.convert_pretrained(WEIGHTS_DIR / "wan", "w8a8-sparse", tmp_path / "out", progress=False)
    state = sparse_attention_of(load_folder(tmp_path / "out"))
    assert state is not None and state.config == SparseAttentionConfig(density=0.15, error_bound=0.05)


def test_a_model_without_a_token_grid_is_refused_naming_the_fix_and_nothing_changes():
    """LTX-Video's spec gives no (frames, rows, columns) grid: the windows cannot be placed, so the
    method, and the w8a8-sparse preset in a conversion, are refused before anything changes."""
    import sixbit
    from fixtures.tiny_models import build_tiny

    model = build_tiny("ltx").model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"does not give its token grid.*leave sparse attention off"):
        apply_sparse_attention(model, SparseAttentionConfig(density=0.2))
    with pytest.raises(ValueError, match=r"does not give its token grid"):
        sixbit.convert_model(model, None, "w8a8-sparse")
    assert sparse_attention_of(model) is None and sixbit.conversion_of(model) is None
    assert not sixbit.runtime.hooks.names(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
