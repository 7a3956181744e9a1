"""``sixbit.optimize``: block offloading with prefetch composes with quantization, DMPQ and the delta cache.

Offloading here is to disk (the only offload a CPU-only machine can measure): weights make an
exact round trip through safetensors and every block computes on the same device, so outputs
must be bit-identical (``torch.equal``) to the same setup without memory optimization.
"""

import copy
import functools
import logging

import pytest
import torch
from safetensors import safe_open

import sixbit
from sixbit.methods.dmpq import RandomAssignment, apply_dmpq
from sixbit.models import iter_blocks
from sixbit.optimize import (
    HOOK_NAME,
    MemoryMode,
    disable_memory_optimization,
    enable_memory_optimization,
)
from sixbit.zoo.shapes import load_pipeline

PROMPT = "a red circle moving right"
# With this threshold and blocks deciding alone, the 8-block models below skip, within 6 steps,
# the first block of a 2-block group while its second block computes: the case where diffusers'
# own group offloading runs the second block on unloaded placeholder weights once a cache sits
# outside its hook (see test_diffusers_group_offloading_alone_breaks_under_block_skips).
THRESHOLD = 0.4
STEPS = 6


def _setup(arch: str, deep: bool = False):
    """The shipped pipeline, quantized to NVFP4; ``deep`` repeats its 4 blocks (8 blocks, 4 groups of 2)."""
    pipe = load_pipeline(arch)
    if deep:
        blocks = pipe.transformer.transformer_blocks if arch == "cogvideox" else pipe.transformer.blocks
        blocks.extend(copy.deepcopy(list(blocks)))
    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="nvfp4"))
    return pipe


def _runtime(pipe):
    """DMPQ (a seeded random policy: half NVFP4, half INT8) under the delta cache."""
    apply_dmpq(pipe.transformer, RandomAssignment(0.5, seed=0))
    config = sixbit.DeltaCacheConfig(threshold=THRESHOLD, final_steps=0, error_budget=5.0, max_skips=3,
                                     decide_per_block=True)
    return sixbit.enable_delta_cache(pipe.transformer, config)


def _generate(pipe):
    out = pipe(PROMPT, num_inference_steps=STEPS, generator=torch.Generator().manual_seed(0), output_type="pt")
    return torch.as_tensor(out.frames)


def _hooked_blocks(model):
    return [b for _, _, b, _ in iter_blocks(model)
            if getattr(b, "_diffusers_hook", None) is not None and b._diffusers_hook.get_hook(HOOK_NAME)]


def _hard_cases(decisions) -> int:
    """(branch, step) pairs where a 2-block group's first block skipped and its second computed."""
    return sum(d == "skip" and decisions.get((br, st, bl + 1)) == "compute"
               for (br, st, bl), d in decisions.items() if bl % 2 == 0)


@functools.cache
def _reference(arch: str):
    """Output, cache decisions and weights of the same setup without memory optimization."""
    pipe = _setup(arch, deep=True)
    cache = _runtime(pipe)
    return _generate(pipe), dict(cache.report().decisions), pipe.transformer.state_dict()


@pytest.mark.parametrize("arch", ["cogvideox", "wan"])  # batched CFG; one call per branch
@pytest.mark.parametrize("memory_first", [True, False], ids=["memory-then-cache", "cache-then-memory"])
def test_offload_with_quant_dmpq_and_cache_is_bit_exact(arch, memory_first, tmp_path):
    reference, decisions, weights = _reference(arch)
    assert _hard_cases(decisions) > 0  # the run really contains the hard case

    pipe = _setup(arch, deep=True)
    kwargs = {"prefetch_depth": 1, "blocks_per_group": 2, "onload_device": "cpu", "offload_device": tmp_path}
    if memory_first:
        memory = enable_memory_optimization(pipe, **kwargs)
        cache = _runtime(pipe)
    else:
        cache = _runtime(pipe)
        memory = enable_memory_optimization(pipe, **kwargs)
    assert torch.equal(_generate(pipe), reference)
    assert cache.report().decisions == decisions
    assert memory.groups == 4 and memory.stats.max_resident_groups == 2
    assert memory.stats.offloads > 0

    folder = memory._folder
    assert folder.parent == tmp_path and len(list(folder.iterdir())) == 4
    memory.disable()
    assert not folder.exists() and not _hooked_blocks(pipe.transformer)
    assert all(torch.equal(weights[k], v) for k, v in pipe.transformer.state_dict().items())


def test_diffusers_group_offloading_alone_breaks_under_block_skips(tmp_path):
    """Why sixbit schedules the groups itself: diffusers onloads a group when its first block
    runs. With the delta cache outside that hook, a skipped first block leaves the group on
    placeholder weights while its second block computes. If this starts passing, diffusers
    fixed it: update the module docstring of sixbit.memory."""
    from diffusers.hooks import apply_group_offloading

    reference, _, _ = _reference("wan")
    pipe = _setup("wan", deep=True)
    apply_group_offloading(pipe.transformer, onload_device="cpu", num_blocks_per_group=2,
                           offload_to_disk_path=str(tmp_path))
    _runtime(pipe)
    try:
        out = _generate(pipe)
    except ValueError as error:  # placeholder weights hold garbage: quantizing activations meets NaN
        assert "NaN" in str(error)
        return
    assert not torch.equal(out, reference)


def test_packed_quantlinear_buffers_are_offloaded_and_restored(tmp_path):
    pipe = _setup("wan")
    model = pipe.transformer
    before = {k: v.clone() for k, v in model.state_dict().items()}
    memory = enable_memory_optimization(model, prefetch_depth=1, onload_device="cpu", offload_device=tmp_path)
    files = sorted(memory._folder.iterdir())
    assert len(files) == memory.groups == len(list(iter_blocks(model)))
    dtypes = set()
    for path in files:
        with safe_open(str(path), "pt") as f:  # the file this call wrote, not a user's file
            dtypes |= {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 — safe_open is not iterable
    assert "U8" in dtypes  # packed NVFP4 codes travel as buffers, in packed form
    assert "disk" in memory.offload
    assert "skipped: no VAE" in memory.tiling
    disable_memory_optimization(model)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("depth", [1, 2])
def test_prefetch_window_bounds_resident_groups(depth, tmp_path):
    pipe = load_pipeline("cogvideox")
    memory = enable_memory_optimization(pipe.transformer, prefetch_depth=depth, onload_device="cpu",
                                        offload_device=tmp_path)
    pipe(PROMPT, num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    stats = memory.stats
    assert stats.groups == 4 and stats.max_resident_groups == depth + 1
    assert stats.sync_loads == 1  # only the very first group; prefetch covers every later entry (wrapping round)
    assert stats.prefetch_hits == 3 * 4 - 1
    # Enabling again replaces the previous installation instead of stacking hooks.
    again = enable_memory_optimization(pipe.transformer, prefetch_depth=1, onload_device="cpu", offload_device=tmp_path)
    assert not memory._folder.exists() and len(_hooked_blocks(pipe.transformer)) == 4
    again.disable()


def test_vae_tiling_uses_tile_size_and_is_restored():
    from diffusers import AutoencoderKLCogVideoX

    pipe = load_pipeline("wan")
    vae = _tiny_wan_vae()
    pipe.register_modules(vae=vae)
    memory = enable_memory_optimization(pipe, tile_size=128, mode="none")
    assert vae.use_tiling and (vae.tile_sample_min_height, vae.tile_sample_stride_width) == (128, 96)
    assert "AutoencoderKLWan" in memory.tiling and memory.mode is MemoryMode.NONE
    memory.disable()
    assert not vae.use_tiling and (vae.tile_sample_min_height, vae.tile_sample_stride_width) == (256, 192)

    cog = AutoencoderKLCogVideoX(block_out_channels=(8, 8), down_block_types=("CogVideoXDownBlock3D",) * 2,
                                 up_block_types=("CogVideoXUpBlock3D",) * 2, latent_channels=4, layers_per_block=1,
                                 norm_num_groups=4)
    pipe.register_modules(vae=cog)
    enable_memory_optimization(pipe, tile_size=64, mode="none")
    assert cog.use_tiling and (cog.tile_sample_min_width, cog.tile_latent_min_width) == (64, 32)
    disable_memory_optimization(pipe)
    assert not cog.use_tiling


def _tiny_wan_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False],
                            latents_mean=[0.0] * 4, latents_std=[1.0] * 4)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="with an accelerator the seed's call offloads to CPU memory")
def test_seed_call_on_a_cpu_only_machine_tiles_and_says_offloading_was_skipped(caplog):
    def seed_call(model):  # seed 000, as written
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sixbit.memory"):
            memory = enable_memory_optimization(model, tile_size=256, prefetch_depth=4)
        (message,) = [r.getMessage() for r in caplog.records if r.name.startswith("sixbit.memory")]
        assert "offloading and prefetch skipped: torch sees no accelerator" in message and "\n" not in message
        assert "offload_device=<folder>" in message
        assert memory.mode is MemoryMode.NONE and memory.stats is None and "skipped" in memory.offload
        assert not _hooked_blocks(pipe.transformer)
        return memory, message

    pipe = load_pipeline("wan")
    reference = _generate(pipe)
    memory, message = seed_call(pipe.transformer)
    assert "VAE tiling skipped: no VAE" in message
    assert torch.equal(_generate(pipe), reference)
    memory.disable()

    vae = _tiny_wan_vae()  # the shapes pipelines are pixel-space: a VAE only to see it tiled
    pipe.register_modules(vae=vae)
    memory, message = seed_call(pipe)
    assert "VAE tiling on AutoencoderKLWan" in message
    assert vae.use_tiling and (vae.tile_sample_min_height, vae.tile_sample_stride_width) == (256, 192)
    memory.disable()
    assert not vae.use_tiling


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "turbo"}, "unknown mode"),
        ({"tile_size": 0}, "tile_size"),
        ({"tile_size": -256}, "tile_size"),
        ({"tile_size": 100}, "multiple of 8"),
        ({"prefetch_depth": 0}, "prefetch_depth"),
        ({"prefetch_depth": 1.5}, "prefetch_depth"),
        ({"blocks_per_group": 0}, "blocks_per_group"),
        ({"onload_device": "cpu", "offload_device": "cpu"}, "offload to disk"),
        ({"onload_device": "warp-drive", "offload_device": "/tmp/x"}, "onload_device"),
        ({"offload_device": 3}, "offload_device"),
        ({"offload_device": "cuda"}, "offload_device"),
    ],
)
def test_bad_input_raises_and_changes_nothing(kwargs, message):
    pipe = load_pipeline("cogvideox")
    model = pipe.transformer
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        enable_memory_optimization(pipe, **kwargs)
    assert not _hooked_blocks(model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_non_model_and_offload_modes_without_accelerator_raise():
    with pytest.raises(ValueError, match="diffusers pipeline or a transformer"):
        enable_memory_optimization("pipe")
    pipe = load_pipeline("wan")
    with pytest.raises(ValueError, match="pass the pipeline"):
        enable_memory_optimization(pipe.transformer, mode="cpu_offload")
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: CPU offload is valid here")
    for mode in ("cpu_offload", "sequential_cpu_offload"):
        with pytest.raises(ValueError, match="no accelerator"):
            enable_memory_optimization(pipe, mode=mode)
    assert not hasattr(pipe.transformer, "_hf_hook")


def test_existing_diffusers_group_offloading_is_rejected(tmp_path):
    from diffusers.hooks import apply_group_offloading

    pipe = load_pipeline("wan")
    apply_group_offloading(pipe.transformer, onload_device="cpu", num_blocks_per_group=1,
                           offload_to_disk_path=str(tmp_path / "diffusers"))
    with pytest.raises(ValueError, match="already has diffusers group offloading"):
        enable_memory_optimization(pipe, onload_device="cpu", offload_device=tmp_path / "sixbit")
    assert not _hooked_blocks(pipe.transformer)


@pytest.mark.skipif(not torch.accelerator.is_available(), reason="CPU-memory offload needs an accelerator to onload to")
def test_memory_offload_to_accelerator_matches():
    pipe = _setup("wan")
    device = torch.accelerator.current_accelerator()
    reference_pipe = _setup("wan").to(device)
    reference = _generate(reference_pipe)
    memory = enable_memory_optimization(pipe.transformer, prefetch_depth=2)
    pipe.text_encoder.to(device)
    out = _generate(pipe)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)
    memory.disable()
    assert all(p.device.type == "cpu" for p in pipe.transformer.parameters())
