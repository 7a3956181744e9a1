"""The one build path of every conversion: for each part of the model (a transformer block, or
the layers outside the blocks), build its layers' new state, then swap it in; any error puts
every replaced layer back.

In-memory quantization (:func:`sixbit.quantize`), the streamed conversion from files
(:func:`sixbit.convert_pretrained`) and static W8A8 (:func:`sixbit.apply_static_w8a8`) all run
:func:`build`; they differ only in their :class:`Recipe`: where a part's input statistics come
from, how one layer is built, and what happens once a part is swapped in (refinement, writing
the part to a checkpoint and freeing it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from torch import nn

from ..models import block_index_of, iter_blocks, swap_layers
from . import spill

#: The name of the part holding the layers outside the blocks (embeddings, projections).
OUTSIDE = "outside blocks"


@dataclasses.dataclass
class Part:
    """One step of a build.

    Attributes:
        name: the block's module name, or :data:`OUTSIDE`.
        module: the block, or the model itself for the layers outside the blocks.
        index: the block's global index (``None`` for :data:`OUTSIDE`).
        layers: the planned layers in it (names under the model), in plan order.
        keys: the part's state keys (the streamed conversion maps and writes them).
    """

    name: str
    module: nn.Module
    index: int | None
    layers: list[str] = dataclasses.field(default_factory=list)
    keys: list[str] = dataclasses.field(default_factory=list)


def parts_of(model: nn.Module, layers: Iterable[str], keys: Iterable[str] = (), outside_alone: bool = True) -> list[Part]:
    """The model's parts in execution order, each with its ``layers`` and state ``keys``.

    ``outside_alone=True``: what lies outside the blocks is a part of its own, first (the model
    is its module), and every block is a part, planned layers or not. ``False``: the layers
    outside the blocks go with block 0, and only parts with planned layers are returned (one
    calibration pass per part: the layers outside the blocks share block 0's).
    """
    found = list(iter_blocks(model))
    blocks = {name: idx for idx, name, _, _ in found}
    outside = Part(OUTSIDE, model, None)
    parts = [Part(name, block, idx) for idx, name, block, _ in found]
    parts.sort(key=lambda p: p.index)
    home = outside if outside_alone else parts[0]
    for attr, names in (("layers", layers), ("keys", keys)):
        for name in names:
            idx = block_index_of(name, blocks)
            getattr(home if idx is None else parts[idx], attr).append(name)
    if outside_alone:
        return [outside, *parts]
    return [part for part in parts if part.layers]


class LayerSwap:
    """Layers put in place of a model's, each replaced one kept until the build is final: the one
    rollback of every conversion.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> swap = LayerSwap(model)
        >>> swap.put({"0": torch.nn.Identity()})
        >>> swap.rollback()
        >>> type(model[0]).__name__
        'Linear'
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.originals: dict[str, nn.Module] = {}

    @classmethod
    def watching(cls, model: nn.Module, names: Iterable[str]) -> LayerSwap:
        """A swap whose rollback puts the layers now called ``names`` back, whatever replaced them
        since: the rollback of a whole conversion (:func:`sixbit.convert_model`: the builds, then
        the methods' fits, static W8A8's own build among them)."""
        swap = cls(model)
        swap.originals = {name: model.get_submodule(name) for name in names}
        return swap

    def original(self, name: str) -> nn.Module:
        """The layer ``name`` was before this build replaced it."""
        if name in self.originals:
            return self.originals[name]
        return self.model.get_submodule(name)

    def put(self, layers: dict[str, nn.Module]) -> None:
        """Swap ``layers`` (``{name: module}``) in, keeping the modules they replace."""
        for name in layers:
            if name not in self.originals:
                self.originals[name] = self.model.get_submodule(name)
        swap_layers(self.model, layers)

    def put_back(self, names: Iterable[str]) -> None:
        """Put the original layers called ``names`` back (they may be swapped in again later)."""
        swap_layers(self.model, {name: self.originals[name] for name in names})

    def forget(self, names: Iterable[str]) -> None:
        """Drop the originals of ``names``: those layers are final (the streamed conversion wrote
        them and frees the part; keeping its full-precision layers would keep every block)."""
        for name in names:
            self.originals.pop(name, None)

    def release(self, names: Iterable[str]) -> None:
        """Nothing reads the originals of ``names`` any more, unless a rollback puts them back:
        inside :func:`~sixbit.builder.spill.spilling` their tensors go to disk until then."""
        kept = spill.active()
        if kept is not None:
            kept.keep([self.originals[n] for n in names
                       if n in self.originals and self.model.get_submodule(n) is not self.originals[n]], self.model)

    def rollback(self) -> None:
        """Put every original layer still kept back in place."""
        swap_layers(self.model, self.originals)
        self.originals = {}


class Recipe:
    """What one kind of conversion does around :func:`build`'s loop. Subclasses define
    :meth:`layer`; the other steps do nothing unless overridden."""

    #: Whether a part's replaced layers are unread once :meth:`built` returns: then
    #: :meth:`LayerSwap.release` spills them (a full-precision model need not stay resident).
    releases_originals = False

    def inputs(self, part: Part) -> dict[str, object]:
        """``{layer name: statistics}`` the part's layers are built from (missing: none)."""
        return {}

    def layer(self, name: str, original: nn.Module, stats: object | None) -> nn.Module:
        """The module that replaces ``original`` (the layer called ``name``)."""
        raise NotImplementedError

    def built(self, part: Part, layers: dict[str, nn.Module], swap: LayerSwap) -> None:
        """Called once ``part``'s new ``layers`` are swapped in."""

    def finish(self, swap: LayerSwap) -> None:
        """Called after the last part, still inside the rollback."""


def build(model: nn.Module, parts: list[Part], recipe: Recipe) -> LayerSwap:
    """For each part in order: its statistics (:meth:`Recipe.inputs`), each planned layer built
    from its original (:meth:`Recipe.layer`), all of them swapped in, then :meth:`Recipe.built`;
    then :meth:`Recipe.finish`. Any error (``KeyboardInterrupt`` included) puts every layer
    still replaced back before it propagates, so the model is as it was (spilled layers are read
    back as the error leaves :func:`~sixbit.builder.spill.spilling`). Returns the swap."""
    swap = LayerSwap(model)
    try:
        for part in parts:
            stats = recipe.inputs(part)
            new = {name: recipe.layer(name, swap.original(name), stats.get(name)) for name in part.layers}
            del stats  # one part's statistics (GPTQ: K × K sums per layer) at a time
            swap.put(new)
            recipe.built(part, new, swap)
            if recipe.releases_originals:
                swap.release(part.layers)
        recipe.finish(swap)
    except BaseException:
        swap.rollback()
        raise
    return swap
