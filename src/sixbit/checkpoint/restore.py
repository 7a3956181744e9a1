"""Restoring a checked checkpoint into a model: :func:`restore`, used by :func:`sixbit.load`
(one file) and by diffusers' ``from_pretrained`` of a converted folder
(:mod:`sixbit.integrations.diffusers`). Every check runs before the model changes."""

from __future__ import annotations

import torch
from torch import nn

from ..methods import record  # noqa: F401  (registers the conversion record, a checkpoint extension)
from .layers import build_layers
from ..memory import allocator
from ..methods.registry import extensions
from ..nn import QuantLinear
from ..version import __version__

EXTENSION_SEPARATOR = "::"  # a runtime method's tensors are stored as "<extension>::<key>"


def restore(model: nn.Module, header: dict, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Put a checked checkpoint's ``header`` and ``tensors`` (read from ``source``) into the
    transformer ``model``: every check first, then the layers, the weights and the methods."""
    stored, ext_tensors = _extension_parts(source, header, tensors)
    if header["model_class"] != type(model).__name__:
        raise ValueError(
            f"{source!r} was saved from a {header['model_class']}, not a {type(model).__name__}"
        )
    new_layers = build_layers(source, header["layers"], dict(model.named_modules()), tensors)
    own = _check_remaining(source, model, new_layers, tensors)
    known = extensions()
    modules = {**dict(model.named_modules()), **new_layers}
    installs = []
    for name in [n for n in known if n in stored]:
        try:
            installs.append(known[name].prepare(model, modules, stored[name], ext_tensors[name]))
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            raise ValueError(f"{source!r}: the stored {name} state is malformed: {e}") from None
        except ValueError as e:
            raise ValueError(f"{source!r}: {e}") from None
    _swap_in(model, new_layers, own)
    for ext in known.values():  # the file's runtime methods replace the model's
        if ext.clear is not None:
            ext.clear(model)
    for install in installs:
        install()


def _extension_parts(source: str, header: dict, tensors: dict[str, torch.Tensor]):
    """(meta, tensors) per extension the file stores; its tensors are taken out of ``tensors``."""
    stored = header.get("extensions", {})
    unknown = [n for n in stored if n not in extensions()]
    if unknown:
        raise ValueError(
            f"{source!r} stores state of runtime method(s) {unknown} that this sixbit ({__version__}) does not "
            "know: load it with the sixbit version that wrote it, or upgrade"
        )
    ext_tensors = {n: {} for n in stored}
    for key in [k for k in tensors if EXTENSION_SEPARATOR in k]:
        ext, _, sub = key.partition(EXTENSION_SEPARATOR)
        if ext not in ext_tensors:
            raise ValueError(f"{source!r} holds tensor {key!r} of no declared extension")
        ext_tensors[ext][sub] = tensors.pop(key)
    return stored, ext_tensors


def _check_remaining(source: str, model: nn.Module, new_layers: dict, tensors) -> dict[str, torch.Tensor]:
    """The file's full-precision tensors, checked to fit ``model`` exactly (names, shapes, dtypes)."""
    expected = {k: v for k, v in model.state_dict().items() if k.rsplit(".", 1)[0] not in new_layers}
    own = {k: v for k, v in tensors.items() if k.rsplit(".", 1)[0] not in new_layers}
    problems = [f"missing {k}" for k in sorted(set(expected) - set(own))]
    problems += [f"unexpected {k}" for k in sorted(set(own) - set(expected))]
    # a model built on the meta device takes the file's dtypes (an empty model is fp32 whatever
    # dtype its checkpoint was converted from); a materialized one must match them
    problems += [
        f"{k}: file {tuple(v.shape)} {v.dtype} vs model {tuple(expected[k].shape)} {expected[k].dtype}"
        for k, v in own.items()
        if k in expected and (v.shape != expected[k].shape
                              or (v.dtype != expected[k].dtype and expected[k].device.type != "meta"))
    ]
    if problems:
        wrong_dtype = [v.dtype for k, v in own.items() if k in expected and v.shape == expected[k].shape
                       and v.dtype != expected[k].dtype and expected[k].device.type != "meta"]
        hint = ""
        if len(wrong_dtype) == len(problems) and len(set(wrong_dtype)) == 1:  # only the dtype differs
            dtype = str(wrong_dtype[0]).removeprefix("torch.")
            hint = (f": the file holds {dtype} tensors; build the model in {dtype} "
                    f"(from_pretrained(..., torch_dtype=torch.{dtype}) or model.to(torch.{dtype})) and load again")
        raise ValueError(f"{source!r} does not fit this model: {problems[:10]}{hint}")
    left_on_meta = [
        n for n, t in [*model.named_parameters(), *model.named_buffers()]
        if t.device.type == "meta" and n not in own and n.rsplit(".", 1)[0] not in new_layers
    ]
    if left_on_meta:
        raise ValueError(
            f"{left_on_meta[:5]} are on the meta device and {source!r} does not hold them (non-persistent "
            "buffers): build the model with accelerate.init_empty_weights(), which keeps buffers, not under "
            "torch.device('meta')"
        )
    return own


def _swap_in(model: nn.Module, new_layers: dict[str, QuantLinear], own: dict[str, torch.Tensor]) -> None:
    """Everything checked: swap the layers in, then copy (or, on meta, assign) the remaining tensors."""
    modules = dict(model.named_modules())
    for name, layer in new_layers.items():
        old = modules[name]
        ref = next(iter(old.parameters()), None)
        if ref is None:
            ref = next(iter(old.buffers()), None)
        if ref is not None and ref.device.type != "meta":
            layer.to(ref.device)
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child, layer)
    with torch.no_grad():
        state = model.state_dict()
        on_meta = {k: v for k, v in own.items() if state[k].device.type == "meta"}
        for k, v in own.items():
            if k not in on_meta:
                state[k].copy_(v)
        if on_meta:  # built with empty weights: take the file's tensors as the parameters
            # Copied out of the file's mapping into ordinary (aligned) memory: a mapped tensor
            # starts wherever the file puts it, and CPU matmul kernels round differently on
            # unaligned inputs. The packed weights stay mapped (read when used, never copied).
            model.load_state_dict({k: v.clone() for k, v in on_meta.items()}, strict=False, assign=True)
    for v in own.values():  # copied: a mapped file's pages read for the copy would otherwise count twice
        allocator.page_out(v)
