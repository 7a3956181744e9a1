"""Meta tensors that stand in for a converted folder's tensors while diffusers loads it.

diffusers loads only the names the empty model's ``state_dict`` holds, and converts each
tensor to the dtype of the one it replaces. A converted folder holds names the
full-precision model lacks (packed weights, runtime methods' state) and dtypes it does not
have, so before loading every name of the folder's table gets a meta tensor of its stored
dtype and shape: on the module at its path (a planned linear gets its packed buffers beside
its own weight), on plain holder modules where no module is (``"<extension>::<key>"``). The
tensors then arrive unconverted; :meth:`Placeholders.remove` takes every stand-in away again
before the checkpoint is restored.
"""

from __future__ import annotations

import torch
from torch import nn


def _dtype(name: str, text) -> torch.dtype:
    dtype = getattr(torch, str(text), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"config.json's tensor table gives {name!r} the unknown dtype {text!r}")
    return dtype


class Placeholders:
    """The stand-ins for one load (see the module doc)."""

    def __init__(self, model: nn.Module, header: dict, table):
        if not isinstance(table, dict) or not all(isinstance(v, list) and len(v) == 2 for v in table.values()):
            raise ValueError("config.json's quantization_config has no valid tensor table: save the model again")
        if header["model_class"] != type(model).__name__:
            raise ValueError(f"this folder holds a converted {header['model_class']}, not a {type(model).__name__}: "
                             f"load it with {header['model_class']}.from_pretrained or DiffusionPipeline.from_pretrained")
        self.model = model
        self.table = {name: (_dtype(name, d), tuple(int(s) for s in shape)) for name, (d, shape) in table.items()}
        state = model.state_dict(keep_vars=True)
        layers = set(header["layers"])
        self.replaced = {k for k in state if k.rpartition(".")[0] in layers and k not in self.table}
        self.added: list[tuple[nn.Module, str]] = []
        self.holders: list[str] = []
        for name, (dtype, shape) in self.table.items():
            module, leaf = self._home(name)
            if name in state:
                if tuple(state[name].shape) != shape:
                    raise ValueError(f"this folder's {name!r} is {shape}, the model's {tuple(state[name].shape)}: "
                                     "it was converted from another configuration of this architecture")
                stand_in = torch.empty(shape, dtype=dtype, device="meta")
                if leaf in module._parameters:
                    module._parameters[leaf] = nn.Parameter(stand_in, requires_grad=False)
                else:
                    module._buffers[leaf] = stand_in
            else:
                module.register_buffer(leaf, torch.empty(shape, dtype=dtype, device="meta"))
                self.added.append((module, leaf))

    def _home(self, name: str) -> tuple[nn.Module, str]:
        """The module holding ``name`` and its last part; holders are made where no module is."""
        *path, leaf = name.split(".")
        module = self.model
        for i, part in enumerate(path):
            child = module._modules.get(part)
            if child is None:
                if "::" not in path[0]:  # only a runtime method's state lives outside the model's modules
                    raise ValueError(f"this folder stores {name!r}, but the model has no module "
                                     f"{'.'.join(path[:i + 1])!r}: was it saved from another model?")
                child = nn.Module()
                module.add_module(part, child)
                if module is self.model:
                    self.holders.append(part)
            module = child
        return module, leaf

    def fits(self, name: str, tensor: torch.Tensor) -> bool:
        return name in self.table and tuple(tensor.shape) == self.table[name][1]

    def check(self, name: str, tensor: torch.Tensor) -> None:
        dtype, shape = self.table[name]
        if tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise ValueError(f"the folder's {name!r} is {tuple(tensor.shape)} {tensor.dtype}, its config.json says "
                             f"{shape} {dtype}: the weight files and config.json are from different saves")

    def remove(self) -> None:
        """Take every stand-in away: added buffers and holder modules (the model's own
        parameters keep their meta stand-ins, which :func:`~sixbit.checkpoint.restore.restore`
        replaces with the received tensors)."""
        for module, leaf in self.added:
            module._buffers.pop(leaf, None)
        for root in self.holders:
            delattr(self.model, root)
        self.added, self.holders = [], []
