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
    assert header["format_version"] == sixbit.checkpoint.FORMAT_VERSION and header["model_class"] == "CogVideoXTransformer3DModel"
    assert header["sixbit_version"] == sixbit.__version__
    layer = header["layers"]["transformer_blocks.0.attn1.to_q"]
    assert layer["weight_format"] == "nvfp4" and layer["hadamard_block"] == 32 and layer["act_mode"] == "fp"
    assert header["layers"]["transformer_blocks.0.attn1.to_k"]["act_mode"] == "int8"  # issue 48: was not stored
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
        sixbit.load({str(path)!r}, model=model)  # the int8 layers' own act_mode comes from the file too
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
    for layer in model.modules():
        if isinstance(layer, QuantLinear):
            layer.act_mode = "nvfp4"  # replaced by the file's
    sixbit.load(path, model)
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
    with pytest.raises(ValueError, match="format version 99.*written by a newer sixbit: upgrade sixbit"):
        sixbit.load(bad, model)
    assert_untouched(model, snap)
    old = _rewrite_header(path, tmp_path / "v1.safetensors", format_version=1)  # issue 48: the fix offered was impossible
    with pytest.raises(ValueError, match="format version 1;.*convert the model again from its full-precision weights"):
        sixbit.load(old, model)
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

    monkeypatch.setattr("sixbit.files.safetensors.shutil.copyfileobj", half_copy)
    with pytest.raises(OSError, match="disk full"):
        sixbit.save(model, path)
    assert path.read_bytes() == before  # the old file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temporary left
    with pytest.raises(ValueError, match=".safetensors"):
        sixbit.save(model, tmp_path / "m.pt")


@pytest.mark.parametrize("fmt", sixbit.formats.available())
def test_expected_layout_of_every_format_matches_a_full_quantization(fmt):
    """Loading checks each packed tensor and the weight's meta against a layout extrapolated from
    1–3 rows (a full zero weight of a 14B model's layer would cost gigabytes): it must be the real one."""
    from sixbit.checkpoint.layers import expected_layout as _expected_layout

    for out_features, in_features in ((5, 256), (48, 512), (33, 768)):
        real = sixbit.formats.get(fmt).quantize(torch.zeros(out_features, in_features))
        layout, meta = _expected_layout(fmt, out_features, in_features)
        assert layout == {k: (tuple(v.shape), v.dtype) for k, v in real.tensors().items()}
        assert meta == real.meta()


# ---------------------------------------------------------------- hostile files (issue 22)


def _rehashed(path, dest, mutate):
    """A copy of ``path`` whose sixbit header ``mutate(header)`` edits, with the checksum
    recomputed: a file a hostile user made self-consistent."""
    from safetensors import safe_open

    from sixbit.files.safetensors import tensor_bytes
    from sixbit.checkpoint.file import _digest

    with safe_open(str(path), "pt") as f:
        header = json.loads(f.metadata()["sixbit"])
    tensors = load_file(path)
    mutate(header)
    header["sha256"] = _digest(((n, tensors[n].dtype, (tensor_bytes(tensors[n]),)) for n in sorted(tensors)), header)
    save_file(tensors, str(dest), metadata={"sixbit": json.dumps(header)})
    return dest


@pytest.fixture(scope="module")
def converted_wan(tmp_path_factory):
    """The shipped Wan model converted with w8a8 + the delta cache, saved."""
    from sixbit.zoo.shapes import load_pipeline

    pipe = load_pipeline("wan")
    config = sixbit.presets.preset("w8a8")
    config.cache = sixbit.presets.DeltaCacheConfig()
    sixbit.convert_model(pipe, quant_config=config)
    return pipe, sixbit.save(pipe, tmp_path_factory.mktemp("wan") / "wan.safetensors")


@pytest.mark.parametrize("edit", [
    ("layers", "blocks.0.attn1.to_q", "hadamard_block"),
    ("layers", "blocks.0.ffn.net.2", "bias"),
    ("extensions", "conversion", "config", "activations"),
])
def test_an_edited_header_field_is_refused(converted_wan, tmp_path, edit):
    _, path = converted_wan
    new = {"hadamard_block": 64, "bias": False, "activations": "fp"}[edit[-1]]
    bad = _rewrite_header(path, tmp_path / "edited.safetensors")  # same header, old checksum kept ...
    from safetensors import safe_open

    with safe_open(str(bad), "pt") as f:
        header = json.loads(f.metadata()["sixbit"])
    node = header
    for key in edit[:-1]:
        node = node[key]
    assert edit[-1] in node
    node[edit[-1]] = new  # ... and one field changed, as a hand edit would
    save_file(load_file(bad), str(bad), metadata={"sixbit": json.dumps(header)})
    from sixbit.zoo.shapes import load_pipeline

    fresh = load_pipeline("wan")
    snap = snapshot(fresh.transformer)
    with pytest.raises(ValueError, match="do not match the stored checksum"):
        sixbit.load(bad, fresh)
    assert_untouched(fresh.transformer, snap)
    assert sixbit.conversion_of(fresh) is None


def test_a_header_declaring_more_than_the_file_holds_is_refused_without_allocating(tmp_path):
    """A 2^26-float entry in a 256 MiB sparse file: the header is read alone, and the checksum
    (which must read the file) streams it in pieces."""
    import struct
    import tracemalloc

    header = {"format": "sixbit", "format_version": sixbit.checkpoint.FORMAT_VERSION, "sixbit_version": "x",
              "model_class": "M", "layers": {}, "sha256": "0" * 64}
    size = 4 << 26
    table = {"__metadata__": {"sixbit": json.dumps(header)},
             "big": {"dtype": "F32", "shape": [1 << 26], "data_offsets": [0, size]}}
    raw = json.dumps(table).encode()
    sparse = tmp_path / "sparse.safetensors"
    with open(sparse, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + size)
    short = tmp_path / "short.safetensors"
    short.write_bytes(sparse.read_bytes()[: 8 + len(raw) + 1024])
    with pytest.raises(ValueError, match="out-of-file entry"):
        sixbit.read_header(short)
    tracemalloc.start()
    try:
        assert sixbit.read_header(sparse)["model_class"] == "M"
        with pytest.raises(ValueError, match="checksum"):
            sixbit.load(sparse, torch.nn.Linear(2, 2))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20  # one 64 MiB piece at a time, never the 256 MiB tensor


@pytest.mark.parametrize("mutate, match", [
    (lambda h: h["extensions"]["conversion"]["config"].update(activations="int9"), "activations"),
    (lambda h: h["extensions"]["conversion"]["config"]["cache"].update(threshold="0.1"), "threshold"),
    (lambda h: h["extensions"]["conversion"].update(stabilize_frames="yes"), "stabilize_frames"),
    (lambda h: h["extensions"]["conversion"]["config"].update(attention={"steps": [3, 1]}), "selects nothing"),
    (lambda h: h["extensions"]["conversion"].pop("config"), "incomplete"),
    (lambda h: h["layers"]["blocks.0.attn1.to_q"].pop("bias"), "bias is missing"),
    (lambda h: h["layers"]["blocks.0.attn1.to_q"].update(in_features="64"), "in_features"),
    (lambda h: h["layers"]["blocks.0.attn1.to_q"].update(act_mode="int9"), "unknown activation mode 'int9'"),
    (lambda h: h["layers"]["blocks.0.attn1.to_q"].update(act_mode=8), "act_mode must be"),
])
def test_a_consistent_but_bad_header_changes_nothing(converted_wan, tmp_path, mutate, match):
    from sixbit.zoo.shapes import load_pipeline

    _, path = converted_wan
    bad = _rehashed(path, tmp_path / "bad.safetensors", mutate)
    fresh = load_pipeline("wan")
    snap = snapshot(fresh.transformer)
    with pytest.raises(ValueError, match=match):
        sixbit.load(bad, fresh)
    assert_untouched(fresh.transformer, snap)
    assert sixbit.conversion_of(fresh) is None and not hasattr(fresh, "save")


def test_missing_header_fields_are_named_by_read_header(converted_wan, tmp_path):
    _, path = converted_wan
    bad = _rehashed(path, tmp_path / "nomodel.safetensors", lambda h: h.pop("model_class"))
    with pytest.raises(ValueError, match="model_class is missing"):
        sixbit.read_header(bad)


def test_loading_replaces_the_runtime_methods_and_gives_the_pipeline_save(converted_wan, tmp_path):
    from sixbit.methods.delta_cache.method import DeltaCache
    from sixbit.runtime import blocks
    from sixbit.zoo.shapes import load_pipeline

    cached, _ = converted_wan
    assert list(blocks.attached(cached.transformer, DeltaCache))
    plain = load_pipeline("wan")
    sixbit.convert_model(plain, quant_config="w8a8")
    no_cache = plain.save(tmp_path / "w8a8.safetensors")
    sixbit.load(no_cache, cached)
    assert sixbit.conversion_of(cached).cache is None
    assert not list(blocks.attached(cached.transformer, DeltaCache))
    fresh = load_pipeline("wan")
    sixbit.load(no_cache, fresh)
    again = fresh.save(tmp_path / "again.safetensors")  # the README's pipe.save after load
    assert sixbit.read_header(again)["layers"] == sixbit.read_header(no_cache)["layers"]


def test_dtype_mismatch_names_the_fix(saved):
    _, path, _ = saved
    with pytest.raises(ValueError, match=r"torch_dtype=torch.float32"):
        sixbit.load(path, build(0).to(torch.bfloat16))


def test_save_keeps_permissions_and_symlinks_and_cleans_orphans(tmp_path):
    model = torch.nn.Sequential(QuantLinear.from_linear(torch.nn.Linear(32, 8)))
    real = tmp_path / "real.safetensors"
    sixbit.save(model, real)
    os.chmod(real, 0o644)
    sixbit.save(model, real)
    assert (os.stat(real).st_mode & 0o777) == 0o644
    link = tmp_path / "link.safetensors"
    link.symlink_to(real)
    sixbit.save(model, link)
    assert link.is_symlink() and os.path.realpath(link) == str(real)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=120)
    orphan = tmp_path / f".real.safetensors.{int(dead.stdout)}.abcd1234.tmp"  # a save killed mid-write
    orphan.write_bytes(b"partial")
    mine = tmp_path / f".real.safetensors.{os.getpid()}.abcd1234.tmp"  # a save of this process: kept
    mine.write_bytes(b"partial")
    sixbit.save(model, real)
    assert not orphan.exists() and mine.exists()


def test_a_model_built_empty_from_the_config_takes_the_files_dtypes(tmp_path):
    """An fp32 model built under init_empty_weights() loads a bf16 conversion as bf16."""
    from accelerate import init_empty_weights

    from sixbit.zoo.shapes import load_pipeline

    pipe = load_pipeline("wan")
    pipe.transformer.to(torch.bfloat16)
    sixbit.convert_model(pipe, quant_config="w8a8")
    path = pipe.save(tmp_path / "bf16.safetensors")
    with init_empty_weights():
        empty = type(pipe.transformer).from_config(pipe.transformer.config)
    sixbit.load(path, empty)
    loaded, source = empty.state_dict(), pipe.transformer.state_dict()
    assert loaded.keys() == source.keys()
    assert all(loaded[k].dtype == v.dtype and torch.equal(loaded[k], v) for k, v in source.items())


# ---- issue 48: models without transformer blocks ----------------------------------------------------------


def test_a_model_without_transformer_blocks_loads_and_a_bare_layer_is_refused_on_save(tmp_path):
    """The example in save()'s docstring: an nn.Sequential of QuantLinear. Loading it used to swap
    the layers in, then fail while clearing the previous conversion's methods (it looked for
    transformer blocks), leaving the model changed."""
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    quantized = torch.nn.Sequential(QuantLinear.from_linear(plain[0], "int8"), torch.nn.GELU(),
                                    QuantLinear.from_linear(plain[2], "nvfp4"))
    x = torch.randn(3, 64)
    sixbit.save(quantized, tmp_path / "seq.safetensors")
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    sixbit.load(tmp_path / "seq.safetensors", fresh)
    assert isinstance(fresh[0], QuantLinear) and torch.equal(fresh(x), quantized(x))
    with pytest.raises(ValueError, match="bare QuantLinear could be saved but never loaded"):
        sixbit.save(quantized[0], tmp_path / "one.safetensors")
    assert not (tmp_path / "one.safetensors").exists()


def test_a_layers_own_act_mode_set_by_quantize_survives_a_reload(tmp_path):
    """Issue 48: ``sixbit.quantize(..., act_mode="int8")`` without convert_model: the layers' own
    precision was not in the checkpoint, and they came back running full-precision activations."""
    model = build(0)
    sixbit.quantize(model, sixbit.QuantConfig(weight_format="int8", act_mode="int8"))
    expected = run(model)
    path = sixbit.save(model, tmp_path / "int8.safetensors")
    fresh = sixbit.load(path, build(1))
    assert {m.act_mode.value for m in fresh.modules() if isinstance(m, QuantLinear)} == {"int8"}
    assert torch.equal(run(fresh), expected)
