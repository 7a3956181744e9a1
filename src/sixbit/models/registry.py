"""Per-architecture metadata: where the blocks are, what they return, what each linear does.

A model is supported by *registering* a :class:`ModelSpec` — never by copying its forward.
Role patterns are ``re.fullmatch`` regular expressions on module names as
``model.named_modules()`` prints them; the first role whose pattern matches wins.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from typing import Callable, Iterator

import torch
from torch import nn

from ..nn import QuantLinear
from ..nn.pointwise_conv import features, is_quantizable
from .roles import Role


@dataclasses.dataclass(frozen=True)
class BlockIO:
    """How a transformer block is called and what it returns.

    Attributes:
        hidden: keyword name of the video-token input, or its positional index.
        encoder: keyword name (or index) of the block's second residual stream, one it also
            returns updated: the text tokens of joint-attention blocks, or the audio tokens of
            audio-video blocks (LTX-2, Kandinsky 6); ``None`` when the block returns one stream.
        returns: the block's outputs in order, each ``"hidden"`` or ``"encoder"``; a block
            returning a bare tensor has ``("hidden",)``. A block returning anything else (a
            control hint, a KV cache) cannot be described, hence not skipped or switched: leave
            its list out of ``ModelSpec.block_lists`` (as Wan VACE's control blocks are).
    """

    hidden: str | int = "hidden_states"
    encoder: str | int | None = None
    returns: tuple[str, ...] = ("hidden",)

    def stream_input(self, block: nn.Module, args: tuple, kwargs: dict, stream: str = "hidden"):
        """The ``stream`` (``"hidden"``/``"encoder"``) input of a call ``block(*args, **kwargs)``."""
        key = self.hidden if stream == "hidden" else self.encoder
        if isinstance(key, str):
            if key in kwargs:
                return kwargs[key]
            key = _positional_index(block, key)
        return args[key] if key is not None and key < len(args) else None

    def with_input(self, block: nn.Module, args: tuple, kwargs: dict, value, stream: str = "hidden") -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a call ``block(*args, **kwargs)`` with its ``stream`` input replaced."""
        key = self.hidden if stream == "hidden" else self.encoder
        if isinstance(key, str):
            if key in kwargs or _positional_index(block, key) is None or _positional_index(block, key) >= len(args):
                return args, {**kwargs, key: value}
            key = _positional_index(block, key)
        return (*args[:key], value, *args[key + 1:]), kwargs

    def stream_output(self, output, stream: str = "hidden"):
        """The ``stream`` output of a block call (``None`` if the block does not return it)."""
        if stream not in self.returns:
            return None
        if not isinstance(output, (tuple, list)):
            return output if stream == "hidden" else None
        return output[self.returns.index(stream)]


@functools.lru_cache(maxsize=None)
def _positional_index_of(cls: type, name: str) -> int | None:
    params = list(inspect.signature(cls.forward).parameters)[1:]  # the first is the instance
    return params.index(name) if name in params else None


def _positional_index(block: nn.Module, name: str) -> int | None:
    return _positional_index_of(type(block), name)


# Role patterns shared by the diffusers video transformers (names relative to the model).
_P_OUTPUT = r"(norm_out\..*|proj_out)"
_P_EMBED = (
    r"(patch_embed|patch_embedding|pos_embed|time_embed|time_embedding|time_proj|ofs_embedding"
    r"|condition_embedder|context_embedder|caption_projection|caption_proj|time_text_embed"
    r"|x_embedder|adaln_single|token_refiner|image_embedder|text_embedder|proj_in|rope)(\..*)?"
)
_P_MODULATION = r".*\.(norm\w*|\w*adaln\w*|\w*ada_norm\w*)\..*"
_P_ATTENTION = (
    r".*\.(attn\d*|attention|self_attn|cross_attn)\."
    r"(to_q|to_k|to_v|to_out\.0|to_out|add_q_proj|add_k_proj|add_v_proj|to_add_out|to_qkv)"
)
_P_FEEDFORWARD = r".*\.(ff|ff_context|ffn|mlp|feed_forward|proj_mlp)(\..*)?"

DEFAULT_ROLES: tuple[tuple[Role, str], ...] = (
    (Role.OUTPUT, _P_OUTPUT),
    (Role.EMBEDDING, _P_EMBED),
    (Role.MODULATION, _P_MODULATION),
    (Role.ATTENTION, _P_ATTENTION),
    (Role.FEEDFORWARD, _P_FEEDFORWARD),
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Metadata of one transformer architecture.

    Attributes:
        name: short name (``"cogvideox"``).
        classes: class names it applies to (``"CogVideoXTransformer3DModel"``).
        block_lists: attribute paths of the ``nn.ModuleList`` s of blocks, in execution order.
        block_io: per block list, a :class:`BlockIO` (one entry applies to all lists).
        roles: ``(role, pattern)`` pairs tried in order before :data:`DEFAULT_ROLES`.
        interleaved: the block lists alternate (list 0 block i, list 1 block i, …), as Latte's
            spatial and temporal blocks do; global indices follow that execution order. (Each
            block has its own index: the delta cache and DMPQ keep per-block state by it.)
        video_grid: ``f(model, args, kwargs) -> (frames, tokens_per_frame)`` of a model call, the
            token grid after patching (video tokens are frame-major), or ``None`` if unknown.
        video_shape: ``f(model, args, kwargs) -> (frames, rows, columns)`` of a model call, the
            same grid with each frame's rows and columns apart (sparse attention's windows), or
            ``None`` if unknown.
        text_tokens: where linears that see both streams find the text tokens: ``"first"``
            (CogVideoX concatenates ``[text, video]``), ``"last"`` (``[video, text]``) or ``None``
            (no such linears are known).
        latent_layout: ``"BFCHW"`` or ``"BCFHW"``: how the model's video latents are laid out
            (calibration from a folder of videos builds them), or ``None`` if unknown.
        encode_video: ``f(vae, pixels) -> latents``: the model family's VAE encoding with its
            latent normalization, ``pixels`` ``(B, 3, F, H, W)`` in [-1, 1], latents
            ``(B, C, F, H, W)`` (calibration from videos); ``None`` if unknown.
        context_parallel: ``f(model) -> plan``: sixbit's context-parallel plan (diffusers'
            ``_cp_plan`` shape) for a class whose diffusers code ships none; its attention then
            runs on the whole ``[text, video]`` sequence through :mod:`sixbit.parallel.sequence`'s
            exchange. ``None``: the class's own plan, or none.
    """

    name: str
    classes: tuple[str, ...]
    block_lists: tuple[str, ...]
    block_io: tuple[BlockIO, ...] = (BlockIO(),)
    roles: tuple[tuple[Role, str], ...] = ()
    interleaved: bool = False
    video_grid: Callable[[nn.Module, tuple, dict], "tuple[int, int] | None"] | None = None
    video_shape: Callable[[nn.Module, tuple, dict], "tuple[int, int, int] | None"] | None = None
    text_tokens: str | None = None
    latent_layout: str | None = None
    encode_video: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None
    context_parallel: Callable[[nn.Module], dict] | None = None

    def io_for(self, block_list: str) -> BlockIO:
        index = self.block_lists.index(block_list)
        return self.block_io[index if len(self.block_io) > 1 else 0]

    def role_of(self, name: str) -> Role:
        """The role of the linear layer called ``name``."""
        for role, pattern in self.roles + DEFAULT_ROLES:
            if re.fullmatch(pattern, name):
                return role
        return Role.OTHER


_REGISTRY: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> ModelSpec:
    """Register ``spec`` for its classes. Example: see ``sixbit/models/diffusers_models.py``."""
    for cls in spec.classes:
        if cls in _REGISTRY:
            raise ValueError(f"a ModelSpec is already registered for {cls}")
        _REGISTRY[cls] = spec
    return spec


def registered() -> dict[str, ModelSpec]:
    """Class name → spec for every registered architecture."""
    return dict(_REGISTRY)


def _linear_weights(module: nn.Module) -> int:
    """Weights of the linear layers inside ``module``, counted as ``in × out`` whether a layer is
    still an ``nn.Linear`` (or a conv quantizable as one) or already a packed :class:`~sixbit.nn.QuantLinear`
    (whose codes are buffers, not parameters): the measure is the same before and after
    quantization."""
    return sum(features(m)[0] * features(m)[1] for m in module.modules()
               if is_quantizable(m) or isinstance(m, QuantLinear))


def _generic_spec(model: nn.Module) -> ModelSpec | None:
    """The ``ModuleList`` of identical blocks holding the most linear weights is the block list.

    Linear weights, not parameters, decide: quantization turns weights into buffers, and the
    same list must be found before and after it (``iter_blocks`` of a converted model, rollback).
    A block's video stream is the first argument of its ``forward``; it is assumed to return it
    as a bare tensor — blocks returning tuples need registered metadata.
    """
    best = None
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) < 2 or len({type(m) for m in mod}) != 1:
            continue
        size = _linear_weights(mod)
        if size and (best is None or size > best[1]):
            best = (name, size, mod[0])
    if best is None:
        return None
    # the class's forward (hooks replace the instance's); its first parameter is the instance
    first = next(iter(list(inspect.signature(type(best[2]).forward).parameters.values())[1:]), None)
    io = BlockIO(hidden=first.name if first is not None and first.kind is first.POSITIONAL_OR_KEYWORD else 0)
    return ModelSpec(name="generic", classes=(type(model).__name__,), block_lists=(best[0],), block_io=(io,))


def spec_for(model: nn.Module) -> ModelSpec:
    """The registered spec of ``model``'s class, else a generic one found from its structure."""
    spec = _REGISTRY.get(type(model).__name__) or _generic_spec(model)
    if spec is None:
        raise ValueError(
            f"{type(model).__name__} has no recognizable transformer blocks (no nn.ModuleList of "
            "identical blocks containing linear layers). Register its metadata: "
            "sixbit.models.register_model(sixbit.models.ModelSpec(name=..., classes=("
            f"'{type(model).__name__}',), block_lists=('path.to.blocks',)))"
        )
    for path in spec.block_lists:
        blocks = _get(model, path)
        if not isinstance(blocks, nn.ModuleList):
            raise ValueError(f"{spec.name} spec names block list {path!r}, which {type(model).__name__} lacks")
    return spec


def _get(model: nn.Module, path: str):
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def iter_blocks(model: nn.Module, spec: ModelSpec | None = None) -> Iterator[tuple[int, str, nn.Module, BlockIO]]:
    """``(global index, module name, block, BlockIO)`` of every block, in execution order."""
    spec = spec or spec_for(model)
    lists = [(path, model.get_submodule(path)) for path in spec.block_lists]
    if spec.interleaved:
        index = 0
        for i in range(max(len(blocks) for _, blocks in lists)):
            for path, blocks in lists:
                if i < len(blocks):
                    yield index, f"{path}.{i}", blocks[i], spec.io_for(path)
                    index += 1
        return
    index = 0
    for path, blocks in lists:
        for i, block in enumerate(blocks):
            yield index, f"{path}.{i}", block, spec.io_for(path)
            index += 1


def swap_layers(root: nn.Module, layers: dict[str, nn.Module]) -> None:
    """Put each module of ``layers`` (``{dotted name under root: module}``) in place of the one there."""
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        setattr(root.get_submodule(parent) if parent else root, child, layer)


def block_index_of(layer_name: str, block_names: dict[str, int]) -> int | None:
    """Global block index of a layer given ``{block module name: index}``, or ``None``."""
    parts = layer_name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        idx = block_names.get(".".join(parts[:cut]))
        if idx is not None:
            return idx
    return None


def transformer_of(model_or_pipe) -> nn.Module:
    """The transformer a user means: ``model_or_pipe`` itself when it is a module, else a
    pipeline's ``.transformer``. Every public entry point that takes "a model or its pipeline"
    resolves it here.

    Example:
        >>> from torch import nn
        >>> layer = nn.Linear(2, 2)
        >>> transformer_of(layer) is layer
        True
    """
    if isinstance(model_or_pipe, nn.Module):
        return model_or_pipe
    transformer = getattr(model_or_pipe, "transformer", None)
    if isinstance(transformer, nn.Module):
        return transformer
    raise ValueError(
        "expected a diffusers transformer (nn.Module) or a pipeline with a .transformer, "
        f"got {type(model_or_pipe).__name__}: pass the pipeline or pipe.transformer"
    )
