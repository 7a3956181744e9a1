"""Random hostile edits of checkpoint headers, configs and LoRA files (bounded: a fixed seed, a few seconds).

Every trial must either work or raise a ``ValueError`` (a ``TypeError`` for a LoRA value of the
wrong kind) that leaves the model as it was; no other exception, no half-changed model, no
allocation driven by a declared size.
"""

import copy
import json
import random
import struct
import threading

import psutil
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_checkpoint import build, inputs

import sixbit
from sixbit.checkpoint.file import _digest
from sixbit.files.safetensors import tensor_bytes
from sixbit.nn import QuantLinear
from sixbit.presets import PRESETS, preset, resolve
from sixbit.runtime import hooks

HOSTILE = [None, -1, 0, 2**31, 2**63, 1e308, float("nan"), True, "", "x", "int9", "0.1", "x" * 10_000, [], [1, "a"],
           {}, {"nested": {"deeper": [None]}}]


def _paths(node, prefix=()):
    """Every (key path) into a JSON tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from _paths(value, prefix + (key,))


def _mutate(tree, rng: random.Random):
    """Replace, delete or add one entry somewhere in ``tree`` (in place); a description."""
    path = rng.choice(list(_paths(tree)))
    parent = tree
    for key in path[:-1]:
        parent = parent[key]
    action = rng.random()
    if action < 0.15 and isinstance(parent, dict):
        del parent[path[-1]]
        return f"del {path}"
    if action < 0.25 and isinstance(parent, dict):
        parent["unknown_" + str(rng.randrange(100))] = rng.choice(HOSTILE)
        return f"add under {path[:-1]}"
    parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
    return f"set {path} = {str(parent[path[-1]])[:30]}"


class PeakRSS:
    """Resident memory growth while the block runs, polled every 5 ms."""

    def __enter__(self):
        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


@pytest.fixture(scope="module")
def converted_file(tmp_path_factory):
    model = build(0)
    config = preset("w8a8")
    config.cache = sixbit.presets.DeltaCacheConfig()
    sixbit.convert_model(model, quant_config=config)
    path = sixbit.save(model, tmp_path_factory.mktemp("fuzz") / "model.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        header = json.loads(f.metadata()["sixbit"])
    return load_file(path), header


def _write(tmp_path, tensors, header, rehash: bool):
    if rehash:  # a self-consistent hostile file: the checksum alone cannot catch it
        header["sha256"] = _digest(((n, tensors[n].dtype, (tensor_bytes(tensors[n]),)) for n in sorted(tensors)), header)
    path = tmp_path / "mutant.safetensors"
    save_file(tensors, str(path), metadata={"sixbit": json.dumps(header)})
    return path


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [type(m).__name__ for m in model.modules()]


def test_mutated_checkpoint_headers_load_or_are_refused_cleanly(converted_file, tmp_path):
    tensors, header = converted_file
    rng = random.Random(0)
    outcomes = {"loaded": 0, "refused": 0}
    reference = None
    for trial in range(60):
        mutant = copy.deepcopy(header)
        what = _mutate(mutant, rng)
        path = _write(tmp_path, tensors, mutant, rehash=trial % 4 != 0)
        model = build(0)
        before = _state(model)
        with PeakRSS() as rss:
            try:
                sixbit.load(path, model)
            except ValueError as e:
                outcomes["refused"] += 1
                assert str(path) in str(e), (what, e)  # names the file
                state, types = _state(model)
                assert types == before[1] and all(torch.equal(state[k], before[0][k]) for k in state), what
                assert sixbit.conversion_of(model) is None, what
            else:
                outcomes["loaded"] += 1  # a harmless edit (a description, a count): the model must run
                with torch.no_grad():
                    out = model(**inputs()).sample
                assert torch.isfinite(out).all(), what
                if reference is None:
                    reference = out
        assert rss.growth < 256 << 20, (what, rss.growth)
    assert outcomes["refused"] > 30  # the fuzzer reaches the checks


def test_mutated_tensor_tables_are_refused_before_any_allocation(converted_file, tmp_path):
    """Edits of the safetensors table itself (shapes, dtypes, offsets declaring up to 2^40 bytes)."""
    tensors, header = converted_file
    path = _write(tmp_path, tensors, copy.deepcopy(header), rehash=False)
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    table = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    rng = random.Random(1)
    names = [k for k in table if k != "__metadata__"]
    for _ in range(40):
        mutant = copy.deepcopy(table)
        entry = mutant[rng.choice(names)]
        field = rng.choice(["shape", "dtype", "data_offsets"])
        entry[field] = rng.choice({
            "shape": [[2**28], [2**20, 2**20], [-1], [], ["3"]],
            "dtype": ["F64", "I8", "X9", 7],
            "data_offsets": [[0, 2**40], [5, 3], [0, 0], ["0", "4"], [0]],
        }[field])
        encoded = json.dumps(mutant).encode()
        encoded += b" " * (-len(encoded) % 8)
        path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
        model = build(0)
        before = _state(model)
        with PeakRSS() as rss:
            for call in (sixbit.read_header, lambda p: sixbit.load(p, model)):
                try:
                    call(path)
                except ValueError:
                    pass
        state, _ = _state(model)
        assert all(torch.equal(state[k], before[0][k]) for k in state), (field, entry)
        assert rss.growth < 256 << 20, (field, entry, rss.growth)


def test_mutated_configs_resolve_or_are_refused_cleanly():
    rng = random.Random(2)
    refused = 0
    for trial in range(300):
        data = preset(PRESETS[trial % len(PRESETS)]).to_dict()
        what = _mutate(data, rng)
        try:
            config = resolve(data)
        except ValueError as e:
            refused += 1
            assert len(str(e)) < 2000, what  # named, not echoed back whole
        else:
            assert resolve(config.to_dict()) == config, what
    assert refused > 150


# ---- tuning targets (issue 48): refused by name before the model runs, or accepted -------------------------------

TUNING_HOSTILE = {
    "max_bits": [float("nan"), float("inf"), -float("inf"), -1, 0, 1, 2, 1e-300, 1e308, 10**400, "5", True, [], 6.0, 16],
    "max_bytes": [float("nan"), float("inf"), -1, 0, 1000, 1.5, 2**63, 10**400, "1e6", False, {}, 10**9],
    "min_psnr": [float("nan"), float("inf"), -5, 0, 1e-9, 99, 150, 1e308, "30", True, [30], 30.0],
    "population": [float("nan"), -1, 0, 2, 3, 4.0, "12", True, None, 2**63, 12, 1000],
    "generations": [0, -3, 1.5, "8", False, 10**6, 1, 8],
    "seed": [1.5, "0", None, float("nan"), [], -7, 2**70],
    "time_budget_s": [0, -1, float("nan"), -float("inf"), "60", True, float("inf"), 1e-3],
    "formats": [[], (), [None], None, "int8", 5, [1], [float("nan")], [["int8"]], ["int9"], ["x" * 10_000], [""],
                ["int4-g256"], ["int4-g64"], ["int4-g256", "int8"], {"int8": 1}, {"int8"}, ["int8", "int8", None],
                ["nvfp4", None]],
}
TUNING_ARGS = tuple(TUNING_HOSTILE)


class _Ran(Exception):
    """The calibration run was called: the arguments were accepted."""


@pytest.fixture(scope="module")
def tiny_tuned():
    from fixtures.tiny_models import build_tiny

    return build_tiny("cogvideox")


def _tuning_trials(rng: random.Random, combos: int):
    """Every hostile value of every argument alone (with the target ``max_bits=8``), then
    ``combos`` random draws of two or three arguments at once (none, one or two targets)."""
    for name, values in TUNING_HOSTILE.items():
        for value in values:
            yield {name: value} if name in TUNING_ARGS[:3] else {"max_bits": 8, name: value}
    for _ in range(combos):
        kwargs = {name: rng.choice(TUNING_HOSTILE[name]) for name in rng.sample(TUNING_ARGS, rng.randrange(2, 4))}
        if rng.random() < 0.7 and not any(n in kwargs for n in TUNING_ARGS[:3]):
            kwargs["max_bits"] = 8
        yield kwargs


def test_hostile_tuning_targets_are_refused_by_name_before_the_model_runs(tiny_tuned):
    """Hostile targets, search sizes and format lists: each gets a ValueError/TypeError that names
    a tuning argument, with the model never run, or is accepted (its first calibration run is
    reached); no other exception."""
    from sixbit.tuning import tune_model

    base = sixbit.ConvertConfig(weights=sixbit.QuantConfig(weight_format="int4-g16"), activations="fp")
    outcomes = {"refused": 0, "accepted": 0}
    for kwargs in _tuning_trials(random.Random(3), combos=40):
        kwargs = {"formats": ["int4-g16", "int8"], **copy.deepcopy(kwargs)}
        runs = []

        def run():
            runs.append(1)
            raise _Ran

        try:
            tune_model(tiny_tuned.model, run, base=base, progress=False, **kwargs)
        except _Ran:
            outcomes["accepted"] += 1
        except (ValueError, TypeError) as e:
            outcomes["refused"] += 1
            assert not runs, (kwargs, e)
            assert any(name in str(e) for name in TUNING_ARGS), (kwargs, e)  # names the argument
            assert len(str(e)) < 3000 and "x" * 100 not in str(e), kwargs  # named, not echoed back whole
        else:
            raise AssertionError(f"{kwargs}: neither refused nor run")
        assert sixbit.conversion_of(tiny_tuned.model) is None
    assert outcomes["refused"] > 80 and outcomes["accepted"] > 20, outcomes


# ---- LoRA files and state dicts (issue 48) -------------------------------------------------------------------

LORA_DTYPES = [torch.int8, torch.int32, torch.int64, torch.bool, torch.uint8, torch.float16, torch.bfloat16,
               torch.float64, torch.complex64, torch.float8_e4m3fn]
LORA_PREFIXES = ["transformer.", "unet.", "base_model.model.", "model.", "text_encoder.", "transformer.transformer.", ""]


@pytest.fixture(scope="module")
def lora_target():
    """A converted tiny model (quantized and full-precision linears), a LoRA on one of each, and
    the model's output with that LoRA loaded."""
    model = build(0)
    sixbit.convert_model(model, quant_config="w8a8")
    quant = next(n for n, m in model.named_modules() if isinstance(m, QuantLinear))
    plain = next(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    g = torch.Generator().manual_seed(4)
    good = {}
    for name in (quant, plain):
        layer = model.get_submodule(name)
        good[f"{name}.lora_A.weight"] = torch.randn(2, layer.in_features, generator=g) / layer.in_features ** 0.5
        good[f"{name}.lora_B.weight"] = 0.1 * torch.randn(layer.out_features, 2, generator=g)
    sixbit.load_lora(model, good, adapter_name="probe")
    with torch.no_grad():
        with_lora = model(**inputs()).sample
    sixbit.unload_lora(model)
    return model, good, with_lora


def _everything(model):
    """What a refused LoRA must leave as it was: weights, LoRAs, hooks and the output."""
    with torch.no_grad():
        out = model(**inputs()).sample
    hooked = {n: hooks.names(m) for n, m in model.named_modules() if hooks.names(m)}
    return _state(model), sixbit.loras(model), hooked, out


def _same(a, b) -> bool:
    (state_a, types_a), loras_a, hooks_a, out_a = a
    (state_b, types_b), loras_b, hooks_b, out_b = b
    return (types_a == types_b and state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
            and loras_a == loras_b and hooks_a == hooks_b and torch.equal(out_a, out_b))


def _try_lora(model, before, lora, what: str, load=None) -> str:
    """Load ``lora`` and unload it again, or see it refused; either way the model ends as it
    began (``before``: :func:`_everything` of it)."""
    try:
        (load or (lambda x: sixbit.load_lora(model, x, adapter_name="fuzz")))(lora)
    except (ValueError, TypeError) as e:
        message = str(e)
        assert message and "\n" not in message and len(message) < 1000, (what, message)  # one line, named
        assert _same(_everything(model), before), what
        return "refused"
    assert sixbit.loras(model) == ["fuzz"] or sixbit.loras(model)[0].startswith("default"), what
    sixbit.unload_lora(model)
    assert _same(_everything(model), before), what  # unloading gives the model back exactly
    return "loaded"


@pytest.mark.parametrize("what", ["transformer.", "unet.", "base_model.model.", "adapter name", "fp64", "fp16",
                                  "alpha = rank", "PEFT metadata", "non-contiguous", "requires grad"])
def test_lora_variants_that_mean_the_same_load_the_same(lora_target, what, tmp_path):
    model, good, with_lora = lora_target
    variant = {
        "adapter name": lambda: {k.replace(".weight", ".default.weight"): v for k, v in good.items()},
        "fp64": lambda: {k: v.double() for k, v in good.items()},
        "fp16": lambda: {k: v.half() for k, v in good.items()},  # the branch's own precision
        "alpha = rank": lambda: good | {k.replace(".lora_A.weight", ".alpha"): torch.tensor(2.0) for k in good if "lora_A" in k},
        "non-contiguous": lambda: {k: v.t().contiguous().t() for k, v in good.items()},
        "requires grad": lambda: {k: v.clone().requires_grad_() for k, v in good.items()},
    }.get(what, lambda: {what + k: v for k, v in good.items()})()
    if what == "PEFT metadata":  # alpha 4, r 4 in the file: scale 1
        save_file(good, str(tmp_path / "l.safetensors"), metadata={"lora_adapter_metadata": json.dumps({"lora_alpha": 4, "r": 4})})
        variant = tmp_path / "l.safetensors"
    sixbit.load_lora(model, variant, adapter_name="same")
    try:
        with torch.no_grad():
            assert torch.equal(model(**inputs()).sample, with_lora), what
    finally:
        sixbit.unload_lora(model)


def _mutate_lora(lora: dict, rng: random.Random) -> str:
    """One hostile edit of a LoRA state dict, in place; a description."""
    key = rng.choice(list(lora)) if lora else "x.lora_A.weight"
    t = lora.get(key)
    if not (isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type == "cpu" and t.dim() == 2):
        t = torch.ones(2, 2)  # an earlier edit left something no tensor edit applies to
    edits = {
        "dtype": lambda: t.to(rng.choice(LORA_DTYPES)),
        "shape": lambda: rng.choice([t.t, lambda: t.unsqueeze(0), t.flatten, lambda: t[:1], lambda: t[:, :1],
                                     lambda: t[:0], lambda: t.float().sum(), lambda: t.repeat(2, 1)])(),
        "value": lambda: t.float().index_fill(0, torch.tensor([0]), rng.choice([float("nan"), float("inf"), -float("inf"), 1e30, 7e4])),
        "rename": lambda: None,
        "delete": lambda: None,
        "alpha": lambda: None,
        "junk": lambda: None,
    }
    kind = rng.choice(list(edits))
    if kind == "rename":
        new = rng.choice(LORA_PREFIXES) + rng.choice([key, key.replace("lora_A", "lora_down"), key.removesuffix(".weight"),
                                                      key.replace("lora_B", "lora_A"), key.replace(".weight", ".x.y.weight")])
        lora[new] = lora.pop(key, t)
        return f"rename {key} → {new}"
    if kind == "delete":
        lora.pop(key, None)
        return f"delete {key}"
    if kind == "alpha":
        module = key.split(".lora_")[0]
        lora[f"{module}.alpha"] = rng.choice([torch.tensor(8.0), torch.tensor(float("nan")), torch.tensor(1e30), torch.ones(3),
                                              torch.tensor(True), torch.tensor(3), torch.zeros(0), torch.tensor(-2.0)])
        return f"alpha of {module}"
    if kind == "junk":
        junk_key, junk = rng.choice([(3, torch.ones(2)), (key, [1, 2]), (key, None), ("y.lora_A.weight", 1.5),
                                     (key, torch.empty(2, 2, device="meta")), (key, t.to_sparse())])
        lora[junk_key] = junk
        return f"junk at {junk_key!r}"
    lora[key] = edits[kind]()
    return f"{kind} of {key}: {tuple(lora[key].shape)} {lora[key].dtype}"


@pytest.mark.filterwarnings("ignore:Casting complex values to real")  # the fuzzer's own dtype edit
def test_mutated_lora_state_dicts_load_or_are_refused_cleanly(lora_target):
    model, good, _ = lora_target
    rng = random.Random(5)
    outcomes = {"loaded": 0, "refused": 0}
    before = _everything(model)
    for trial in range(150):
        lora = dict(good)
        what = "; ".join(_mutate_lora(lora, rng) for _ in range(rng.randint(1, 3)))
        diffusers = trial % 5 == 0  # diffusers' entry point (converted models route it here) too
        load = (lambda x: model.load_lora_adapter(x, adapter_name="fuzz", prefix="transformer")) if diffusers else None
        outcomes[_try_lora(model, before, lora, what, load)] += 1
    assert outcomes["refused"] > 75 and outcomes["loaded"] > 5, outcomes  # the fuzzer reaches both


def test_hostile_lora_files_load_or_are_refused_cleanly(lora_target, tmp_path):
    """Truncated or flipped bytes anywhere in the file, and hostile PEFT metadata."""
    model, good, _ = lora_target
    path = tmp_path / "lora.safetensors"
    save_file(good, str(path))
    raw = path.read_bytes()
    rng = random.Random(6)
    outcomes = {"loaded": 0, "refused": 0}
    before = _everything(model)
    for trial in range(60):
        data = bytearray(raw)
        if trial % 3 == 0:
            data = data[:rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        outcomes[_try_lora(model, before, path, f"trial {trial}")] += 1
    for hostile in HOSTILE:
        meta = rng.choice([hostile, {"r": hostile}, {"lora_alpha": hostile, "r": 2}, {"alpha_pattern": hostile},
                           {"rank_pattern": {next(iter(good)).split(".lora_")[0]: hostile}}, {"transformer.r": hostile}])
        save_file(good, str(path), metadata={"lora_adapter_metadata": json.dumps(meta)})
        outcomes[_try_lora(model, before, path, f"metadata {str(meta)[:60]}")] += 1
    assert outcomes["refused"] > 30 and outcomes["loaded"] > 0, outcomes
