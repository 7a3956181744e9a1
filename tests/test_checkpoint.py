import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file, save_file

import sixbit
from sixbit.nn import QuantLinear

# A tiny diffusers CogVideoX transformer; the same code builds it in the fresh process below.
BUILD = textwrap.dedent(
    """
    import torch
    from diffusers import CogVideoXTransformer3DModel

    def build(seed):
        torch.manual_seed(seed)
        return CogVideoXTransformer3DModel(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
            time_embed_dim=32, text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8,
            sample_frames=9, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=8,
        ).eval()

    def inputs():
        g = torch.Generator().manual_seed(123)
        return dict(
            hidden_states=torch.randn(1, 3, 4, 8, 8, generator=g),
            encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
            timestep=torch.tensor([500]),
        )
    """
)
ns: dict = {}
exec(BUILD, ns)
build, inputs = ns["build"], ns["inputs"]

FORMATS = {"attn1.to_q": "nvfp4", "attn1.to_k": "int8", "attn1.to_v": "mxfp6_e2m3", "ff.net.0.proj": "int4-asym-g32", "ff.net.2": "fp8_e4m3"}


def quantized_model(seed=0):
    model = build(seed)
    for name, mod in list(model.named_modules()):
        for suffix, fmt in FORMATS.items():
            if name.startswith("transformer_blocks.") and name.endswith(suffix):
                parent, _, child = name.rpartition(".")
                block = 32 if fmt == "nvfp4" else None
                layer = QuantLinear.from_linear(mod, fmt, hadamard_block=block, act_mode="int8" if fmt == "int8" else "fp")
                setattr(model.get_submodule(parent), child, layer)
    return model


def run(model):
    with torch.no_grad():
        return model(**inputs()).sample


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [type(m).__name__ for m in model.modules()]


def assert_untouched(model, snap):
    state, types = snap
    assert [type(m).__name__ for m in model.modules()] == types
    now = model.state_dict()
    assert now.keys() == state.keys() and all(torch.equal(now[k], state[k]) for k in state)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = quantized_model()
    path = sixbit.save(model, tmp_path_factory.mktemp("ckpt") / "model.safetensors")
    return model, path, run(model)


def test_header_and_bytes(saved):
    model, path, _ = saved
    header = sixbit.read_header(path)
    assert header["format_version"] == 1 and header["model_class"] == "CogVideoXTransformer3DModel"
    assert header["sixbit_version"] == sixbit.__version__
    layer = header["layers"]["transformer_blocks.0.attn1.to_q"]
    assert layer["weight_format"] == "nvfp4" and layer["hadamard_block"] == 32
    assert len(header["layers"]) == 2 * len(FORMATS)
    stored = load_file(path)
    assert stored["transformer_blocks.0.attn1.to_q.weight_codes"].dtype == torch.uint8
    assert "transformer_blocks.0.attn1.to_q.weight" not in stored  # no full-precision copy


def test_load_in_fresh_process_is_bit_exact(saved, tmp_path):
    _, path, expected = saved
    save_file({"expected": expected}, str(tmp_path / "expected.safetensors"))
    script = BUILD + textwrap.dedent(
        f"""
        import sixbit
        from safetensors.torch import load_file
        model = build(seed=7)  # different random init: everything must come from the file
        sixbit.load({str(path)!r}, model=model)
        model.get_submodule("transformer_blocks.0.attn1.to_k").act_mode = "int8"
        model.get_submodule("transformer_blocks.1.attn1.to_k").act_mode = "int8"
        with torch.no_grad():
            out = model(**inputs()).sample
        assert torch.equal(out, load_file({str(tmp_path / 'expected.safetensors')!r})["expected"]), "outputs differ"
        print("BIT-EXACT")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "BIT-EXACT" in proc.stdout


def test_load_into_already_quantized_model(saved):
    _, path, expected = saved
    model = quantized_model(seed=3)
    sixbit.load(path, model)
    for name in ("transformer_blocks.0.attn1.to_k", "transformer_blocks.1.attn1.to_k"):
        model.get_submodule(name).act_mode = "int8"
    assert torch.equal(run(model), expected)


def test_truncated_file(saved, tmp_path):
    _, path, _ = saved
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])
    model = build(0)
    snap = snapshot(model)
    with pytest.raises(ValueError, match="truncated or corrupted"):
        sixbit.load(bad, model)
    assert_untouched(model, snap)


def test_corrupted_payload(saved, tmp_path):
    _, path, _ = saved
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF  # flip bits inside the last tensor
    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(bytes(data))
    model = build(0)
    snap = snapshot(model)
    with pytest.raises(ValueError, match="corrupted"):
        sixbit.load(bad, model)
    assert_untouched(model, snap)


def _rewrite_header(path, dest, **changes):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        header = json.loads(f.metadata()["sixbit"])
    header.update(changes)
    save_file(load_file(path), str(dest), metadata={"sixbit": json.dumps(header)})
    return dest


def test_unknown_format_version(saved, tmp_path):
    _, path, _ = saved
    bad = _rewrite_header(path, tmp_path / "v99.safetensors", format_version=99)
    model = build(0)
    snap = snapshot(model)
    with pytest.raises(ValueError, match="format version 99"):
        sixbit.load(bad, model)
    assert_untouched(model, snap)


def test_other_architecture(saved):
    _, path, _ = saved
    with pytest.raises(ValueError, match="saved from a CogVideoXTransformer3DModel"):
        sixbit.load(path, torch.nn.Sequential(torch.nn.Linear(32, 32)))
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(0)
    wider = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=32, in_channels=4, out_channels=4, time_embed_dim=32,
        text_embed_dim=32, num_layers=2, sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
    )
    snap = snapshot(wider)
    with pytest.raises(ValueError, match="another model config"):
        sixbit.load(path, wider)
    assert_untouched(wider, snap)
    shallower = build(0)
    del shallower.transformer_blocks[1]
    snap = snapshot(shallower)
    with pytest.raises(ValueError, match="lacks"):
        sixbit.load(path, shallower)
    assert_untouched(shallower, snap)


def test_not_a_sixbit_file(tmp_path):
    plain = tmp_path / "plain.safetensors"
    save_file({"a": torch.zeros(2)}, str(plain))
    with pytest.raises(ValueError, match="not a sixbit checkpoint"):
        sixbit.load(plain, build(0))
    with pytest.raises(ValueError, match="no checkpoint"):
        sixbit.load(tmp_path / "missing.safetensors", build(0))


def test_atomic_save(tmp_path, monkeypatch):
    model = quantized_model()
    path = sixbit.save(model, tmp_path / "m.safetensors")
    before = path.read_bytes()

    def half_copy(src, dst, length=0):
        dst.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr("sixbit._io.shutil.copyfileobj", half_copy)
    with pytest.raises(OSError, match="disk full"):
        sixbit.save(model, path)
    assert path.read_bytes() == before  # the old file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temporary left
    with pytest.raises(ValueError, match=".safetensors"):
        sixbit.save(model, tmp_path / "m.pt")


@pytest.mark.parametrize("fmt", sixbit.formats.available())
def test_expected_layout_of_every_format_matches_a_full_quantization(fmt):
    """Loading checks each packed tensor against a layout extrapolated from 1–3 rows (a full
    zero weight of a 14B model's layer would cost gigabytes): it must be the real one."""
    from sixbit.checkpoint import _expected_layout

    for out_features, in_features in ((5, 256), (48, 512), (33, 768)):
        real = sixbit.formats.get(fmt).quantize(torch.zeros(out_features, in_features)).tensors()
        assert _expected_layout(fmt, out_features, in_features) == {k: (tuple(v.shape), v.dtype) for k, v in real.items()}
