"""The work counter on the shipped shapes-wan transformer: FLOPs by hand, skips, precision."""

import pytest
import torch
from diffusers.hooks import HookRegistry, ModelHook

import sixbit
from sixbit.bench.counting import WorkCounter
from sixbit.zoo.shapes import load_pipeline


class _SkipBlock(ModelHook):
    """Return the block's input unchanged: the block's linears and attention never run."""

    def new_forward(self, module, hidden_states, *args, **kwargs):
        return hidden_states


def _run(pipe, counter):
    with torch.no_grad(), counter:
        pipe("a red circle moving right", num_inference_steps=2, guidance_scale=1.0,
             generator=torch.Generator().manual_seed(0))
    counter.remove()
    return counter.totals()


def test_flops_skips_and_precision():
    pipe = load_pipeline("wan")
    fp = _run(pipe, WorkCounter(pipe.transformer))
    blocks = len(pipe.transformer.blocks)
    assert fp.block_calls == 2 * blocks and fp.blocks_skipped == 0
    # by hand: one block's self-attention on the video tokens of one sample
    cfg = pipe.transformer.config
    tokens = (8 // cfg.patch_size[0]) * (32 // cfg.patch_size[1]) * (32 // cfg.patch_size[2])
    dim = cfg.num_attention_heads * cfg.attention_head_dim
    self_attn = 2.0 * tokens * tokens * 2 * dim
    assert fp.attention_flops > 2 * blocks * self_attn  # plus cross-attention to the text tokens
    ffn = 2 * 2.0 * tokens * dim * cfg.ffn_dim
    assert fp.gemm_flops["fp"] > 2 * blocks * ffn

    pipe = load_pipeline("wan")
    HookRegistry.check_if_exists_or_initialize(pipe.transformer.blocks[1]).register_hook(_SkipBlock(), "skip")
    skipped = _run(pipe, WorkCounter(pipe.transformer))
    assert skipped.blocks_skipped == 2 and skipped.skip_share == pytest.approx(1 / blocks)
    assert skipped.attention_flops == pytest.approx(fp.attention_flops * (blocks - 1) / blocks)

    pipe = load_pipeline("wan")
    sixbit.quantize(pipe.transformer, sixbit.QuantConfig(weight_format="int8", act_mode="int8"))
    q = _run(pipe, WorkCounter(pipe.transformer))
    assert q.total_gemm_flops == pytest.approx(fp.total_gemm_flops)
    assert q.gemm_flops["int8"] > 0.9 * q.total_gemm_flops and q.average_act_bits() < 9
