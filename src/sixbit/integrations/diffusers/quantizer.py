"""``SixbitQuantizer``: diffusers' ``from_pretrained`` with ``quantization_config=SixbitConfig(...)``.

Two ways in, both through the hooks diffusers gives every quantization backend:

- **Quantize while loading** (a full-precision folder and a calibration-free config). Before the
  weights load, the layers to quantize are planned on the empty (meta) model as
  :func:`sixbit.convert_model` plans them. Each planned linear's weight and bias are taken as
  their shard arrives and the layer is built at once (:func:`sixbit.builder.quantized_linear`)
  and swapped in, so the full-precision model is never resident. After loading, the config's
  runtime methods are installed as ``convert_model`` installs them: the result equals
  ``from_pretrained`` then ``convert_model``, bit for bit.
- **A converted folder** (``config.json`` carries the checkpoint header,
  :mod:`.folder`). Every tensor of the folder is taken as it arrives, unconverted, and the whole
  checkpoint is checked and restored as :func:`sixbit.load` restores a file
  (:func:`sixbit.checkpoint.restore.restore`): checksum, layers, weights, runtime methods.
  ``torch_dtype`` then applies to the full-precision parameters; packed weights keep their
  stored form.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from accelerate.utils import set_module_tensor_to_device
from diffusers.quantizers.base import DiffusersQuantizer
from torch import nn

from ...builder import LayerSwap, plan_layers, quantized_linear
from ...checkpoint import check_header, check_tensors, finish
from ...checkpoint.restore import restore
from ...config import ConvertConfig
from ...methods.record import install
from ...convert import fit_methods
from ...preflight import check_convertible
from ...memory import allocator
from ...nn import QuantLinear
from ...presets import calibration_free, for_device
from .casting import attach_casts
from .config import SixbitConfig
from .placeholders import Placeholders


class SixbitQuantizer(DiffusersQuantizer):
    """The diffusers quantization backend ``"sixbit"`` (registered on ``import sixbit``)."""

    requires_calibration = False
    use_keep_in_fp32_modules = True  # the model's float32 modules stay float32, as without a quantizer

    def __init__(self, quantization_config: SixbitConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        if self.pre_quantized and not quantization_config.pre_quantized:
            raise ValueError("this folder's config.json names quant_method 'sixbit' but holds no checkpoint header: "
                             "it was not written by a converted model's save_pretrained; convert the model again")
        if not self.pre_quantized and quantization_config.pre_quantized:
            raise ValueError("this SixbitConfig describes an already converted folder: load that folder with "
                             "from_pretrained(folder), without quantization_config")
        self.requested_dtype: torch.dtype | None = None
        self.plan: dict[str, tuple[str, int | None, str]] = {}
        self.pending: dict[str, dict[str, torch.Tensor]] = {}
        self.received: dict[str, torch.Tensor] = {}
        self.placeholders: Placeholders | None = None
        self.config: ConvertConfig | None = None
        self.chosen: dict = {}
        self.hardware: str | None = None
        self.keep_in_fp32: list[str] = []
        self.files: dict[str, str] | str | None = None  # where each tensor is read from (_files_of)

    # -- what diffusers asks before loading -------------------------------------------------
    def validate_environment(self, *args, **kwargs):
        if kwargs.get("from_flax"):
            raise ValueError("sixbit quantizes PyTorch weights: load the PyTorch checkpoint, not a Flax one")

    def update_torch_dtype(self, torch_dtype):
        if self.pre_quantized:  # tensors arrive as stored (the checksum covers their bytes); cast afterwards
            self.requested_dtype = torch_dtype
            return None
        return torch_dtype

    def maybe_update_loaded_keys(self, loaded_keys, checkpoint_files):
        self.files = _files_of(checkpoint_files)  # only to name the file in a refusal
        return loaded_keys

    def check_quantized_param_shape(self, param_name, current_param, loaded_param):
        return self.placeholders is not None and self.placeholders.fits(param_name, loaded_param)

    def _process_model_before_weight_loading(self, model, device_map=None, keep_in_fp32_modules=None, **kwargs):
        self.keep_in_fp32 = list(keep_in_fp32_modules or [])
        if self.pre_quantized:
            check_header(self.quantization_config.checkpoint, "quantization_config of config.json")
            self.placeholders = Placeholders(model, self.quantization_config.checkpoint,
                                             self.quantization_config.tensors)
            return model
        config, self.hardware = for_device(self.quantization_config.convert_config, _device_of(device_map))
        # the one pre-flight check (sixbit.preflight): each method refuses what it cannot run, before any weight loads
        self.chosen = check_convertible(config, model, empty=True)
        if config.needs_calibration:
            raise ValueError(
                f"{config.calibration_reason()} needs calibration, which from_pretrained cannot run: load the model, "
                "then sixbit.convert_model(pipe, calibration_data, ...) (or `sixbit convert`), or quantize while "
                f"loading with a calibration-free config: {list(calibration_free())} (w4a16: SixbitConfig('w4a16', gptq=False))"
            )
        self.config = config
        self.plan = plan_layers(model, config.weights) if config.weights is not None else {}
        return model

    # -- each tensor as its shard arrives ---------------------------------------------------
    def check_if_quantized_param(self, model, param_value, param_name, state_dict, **kwargs) -> bool:
        if self.pre_quantized:
            return self.placeholders is not None and param_name in self.placeholders.table
        return True  # every tensor: see create_quantized_param

    def create_quantized_param(self, model, param_value, param_name, target_device, state_dict=None,
                               unexpected_keys=None, **kwargs):
        if self.pre_quantized:
            self.placeholders.check(param_name, param_value)
            self.received[param_name] = param_value
            return
        layer, _, leaf = param_name.rpartition(".")
        if layer not in self.plan or leaf not in ("weight", "bias"):
            # a copy of its own: a view would keep the whole shard's file mapping (and every page of it
            # read so far) alive after the shard is done, and the full-precision model would add up in RSS
            set_module_tensor_to_device(model, param_name, _device(target_device), value=param_value.clone(),
                                        dtype=param_value.dtype)  # as diffusers converted it (float32-kept modules)
            allocator.page_out(param_value)  # read once: its shard's pages leave the RSS
            return
        self.pending.setdefault(layer, {})[leaf] = param_value
        if "weight" in self.pending[layer] and (model.get_submodule(layer).bias is None or "bias" in self.pending[layer]):
            self._build(model, layer, self.pending.pop(layer), target_device)

    def _build(self, model: nn.Module, name: str, parts: dict[str, torch.Tensor], device) -> None:
        """The planned layer ``name`` (a linear or a pointwise conv, still empty) with its arrived
        tensors, quantized and swapped in."""
        layer = copy.deepcopy(model.get_submodule(name))  # on the meta device: costs nothing
        for leaf, value in parts.items():  # the bias is kept: a copy, not a view of the shard (as above)
            set_module_tensor_to_device(layer, leaf, _device(device), value=value.clone() if leaf == "bias" else value)
        fmt, hadamard_block, role = self.plan[name]
        key = f"{name}.weight"
        source = self.files.get(key) if isinstance(self.files, dict) else self.files
        LayerSwap(model).put({name: quantized_linear(layer, fmt, hadamard_block, self.config.weights, role,
                                                     name=name, source=source)})
        for value in parts.values():
            allocator.page_out(value)
        del layer, parts
        allocator.trim()  # the layer's temporaries: without it the heap keeps ~1.5× the quantized model

    # -- after the last shard ---------------------------------------------------------------
    def _process_model_after_weight_loading(self, model, **kwargs):
        if self.pre_quantized:
            self._restore(model)
        else:
            self._finish(model)
        finish(model)  # .save, save_pretrained, diffusers' LoRA methods, the layout hook (sixbit.checkpoint.finishing)
        attach_casts(model)
        return model

    def _finish(self, model: nn.Module) -> None:
        missing = sorted(set(self.plan) - {n for n, m in model.named_modules() if isinstance(m, QuantLinear)})
        if missing or self.pending:
            raise ValueError(f"the checkpoint lacks the weights of {sorted(set(missing) | set(self.pending))[:5]}: "
                             "is the folder complete?")
        install(model, self.config, fit_methods(model, self.chosen, None, None), None, self.hardware)

    def _restore(self, model: nn.Module) -> None:
        header = self.quantization_config.checkpoint
        source = f"{type(model).__name__} folder"
        self.placeholders.remove()
        missing = sorted(set(self.placeholders.table) - set(self.received))
        if missing:
            raise ValueError(f"{source}: the weight files lack {len(missing)} tensor(s) config.json lists, e.g. "
                             f"{missing[:3]}: a shard is missing or belongs to another save; copy the whole folder again")
        check_tensors(header, self.received, source)
        for t in self.received.values():  # the checksum read every page: packed weights are read again when used
            allocator.page_out(t)
        restore(model, header, self.received, source)
        self.received = {}
        if self.requested_dtype is not None:
            _cast_full_precision(model, self.requested_dtype, self.keep_in_fp32)

    # -- what diffusers asks about the result -----------------------------------------------
    def update_missing_keys(self, model, missing_keys, prefix):
        if self.pre_quantized and self.placeholders is not None:
            return [k for k in missing_keys if k not in self.placeholders.replaced]
        return missing_keys

    @property
    def supports_parallel_loading(self) -> bool:  # create_quantized_param keeps per-layer state
        return False

    @property
    def is_serializable(self) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def _files_of(checkpoint_files) -> dict[str, str] | str | None:
    """The file every tensor of a checkpoint is read from: the one file, or ``{tensor: shard}``
    from the shards' index next to them (``None`` where neither is known)."""
    files = [str(f) for f in checkpoint_files or () if isinstance(f, (str, os.PathLike))]
    if len(files) == 1:
        return files[0]
    folder = Path(files[0]).parent if files else None
    for index in sorted(folder.glob("*.safetensors.index.json")) if folder else ():
        try:
            return {key: str(folder / file) for key, file in json.loads(index.read_text())["weight_map"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
    return None


def _device(target) -> str | torch.device:
    """Where a loaded tensor goes (diffusers' ``param_device``; a disk offload is not one)."""
    return "cpu" if target in (None, "disk") else target


def _device_of(device_map) -> torch.device:
    if isinstance(device_map, dict) and device_map:
        device_map = next(iter(device_map.values()))
    if device_map in (None, "auto", "balanced", "sequential", "disk"):
        return torch.device("cpu")
    return torch.device(device_map if not isinstance(device_map, int) else f"cuda:{device_map}")


def _cast_full_precision(model: nn.Module, dtype: torch.dtype, keep_in_fp32: list[str]) -> None:
    """``torch_dtype`` for everything but the packed layers, which keep their stored form, and the
    tensors the model keeps in float32 (diffusers' ``_keep_in_fp32_modules``, matched as diffusers
    matches them: a part of the tensor's name)."""
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear):
            continue
        for store in (module._parameters, module._buffers):
            for key, t in store.items():
                full = f"{name}.{key}" if name else key
                if (t is None or not t.is_floating_point() or t.dtype == dtype
                        or key in module._non_persistent_buffers_set  # built by the model, as diffusers leaves them
                        or any(keep in full.split(".") for keep in keep_in_fp32)):
                    continue
                converted = t.detach().to(dtype)
                store[key] = nn.Parameter(converted, requires_grad=False) if isinstance(t, nn.Parameter) else converted
