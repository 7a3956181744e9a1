"""Training-free block-sparse attention for video: windows in space and time, per head and step.

:func:`apply_sparse_attention` hooks the transformer (to read each call's token grid from its
latent: frames, rows, columns after patching, from the :class:`~sixbit.models.ModelSpec`'s
``video_shape``) and every attention module inside its blocks. While a module runs, its
``F.scaled_dot_product_attention`` calls (directly, or through diffusers' dispatcher's native
backend) are taken by a ``TorchFunctionMode``: a self-attention call over the whole grid (video
tokens, with the text joined first or last as the spec's ``text_tokens`` says) runs
block-sparse (:mod:`.mask`'s tables, :func:`sixbit.kernels.block_sparse.block_sparse_attention`);
every other call runs unchanged and is counted: cross-attention (Wan's text keys), a mask,
dropout, causal, grouped heads, a length the grid does not place, and every call of the
``warmup_steps`` first steps. A mask keeping ≥ :data:`DENSE_ABOVE` of the blocks also runs the
unchanged call (bit-identical to no method): flex attention's dense path is slower than SDPA's.

**Fixed budget** (``density``, or a ``window``): every head keeps the same table. **Adaptive**
(``error_bound``): at each call, on ``sample_rows`` video query rows spread evenly over the
grid, the dense output of each head is compared with its output under each table of the
ladder, from the budget's up; each head takes the first table whose relative L2 error is within
the bound (dense if none is). On random weights attention is not local and heads go dense;
trained video models keep most heads sparse (SVG's observation).

Config → state → hook → ``apply_sparse_attention`` / ``remove_sparse_attention``. As part of a
conversion, ``ConvertConfig(..., methods=(SparseAttentionConfig(...),))`` installs it, and
checkpoints carry its config.

Example:
    >>> state = apply_sparse_attention(pipe.transformer, SparseAttentionConfig(density=0.2))  # doctest: +SKIP
    >>> pipe("a red circle moving right"); state.sparse_calls > 0                             # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from diffusers.hooks import ModelHook
from torch import nn
from torch.overrides import TorchFunctionMode

from ...config.sparse_attention import SparseAttentionConfig
from ...kernels.block_sparse import block_sparse_attention
from ...models import iter_blocks, spec_for, transformer_of
from ...runtime import hooks
from ...runtime.context import StepTracker, track_steps
from ...runtime.wrapped import changes_model
from ..registry import attention_kernel_clash
from .mask import Rung, TokenGrid, budget_rung, ladder, tile_order, window_table

NAME = "sparse_attention"
HOOK_NAME = "sixbit_sparse_attention"
GRID_HOOK_NAME = "sixbit_sparse_attention_grid"
#: a call whose table keeps at least this share of the blocks runs dense SDPA (module docstring)
DENSE_ABOVE = 0.9


@dataclasses.dataclass
class SparseAttentionState:
    """What sparse attention did since the last :meth:`reset`."""

    config: SparseAttentionConfig
    path: str = ""  # the kernel of the sparse calls, in words
    sparse_calls: int = 0  # self-attention calls run block-sparse
    dense_calls: int = 0  # past the warm-up, but the table kept ≥ DENSE_ABOVE (adaptive: heads went dense)
    warmup_calls: int = 0  # self-attention calls of the dense warm-up steps
    other_calls: int = 0  # cross-attention, masks, lengths the grid does not place: run unchanged
    widened_heads: int = 0  # adaptive: head calls that took a wider table than the budget's
    dense_heads: int = 0  # adaptive: head calls that went dense
    density_sum: float = 0.0  # over sparse and dense calls: each call's kept share of blocks (dense: 1)
    head_density: dict = dataclasses.field(default_factory=dict)  # attention module → last call's share per head

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            if f.name not in ("config", "path"):
                setattr(self, f.name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)

    @property
    def achieved_density(self) -> float | None:
        """The mean share of blocks the post-warm-up self-attention calls ran (dense ones: 1.0)."""
        calls = self.sparse_calls + self.dense_calls
        return self.density_sum / calls if calls else None


class SparseAttention:
    """The installed method: the token grid of the current call, the ladders per grid, the state."""

    def __init__(self, model: nn.Module, config: SparseAttentionConfig, tracker: StepTracker):
        spec = spec_for(model)
        device = next(model.parameters()).device
        self.config, self.tracker = config, tracker
        self.state = SparseAttentionState(config, f"flex_attention compiled for {device.type}")
        self.shape_fn, self.text_tokens = spec.video_shape, spec.text_tokens
        self.shape: tuple[int, int, int] | None = None  # (frames, rows, columns) of the current call
        self._ladders: dict[TokenGrid, tuple[list[Rung], int, torch.Tensor | None]] = {}

    def grid(self, tokens: int) -> TokenGrid | None:
        """Where ``tokens`` tokens of a self-attention call lie, or ``None`` when the grid does not place them."""
        if self.shape is None:
            return None
        frames, rows, cols = self.shape
        text = tokens - frames * rows * cols
        if text == 0:
            return TokenGrid(frames, rows, cols)
        if text < 0 or self.text_tokens not in ("first", "last"):
            return None
        return TokenGrid(frames, rows, cols, text, self.text_tokens == "first")

    def rungs(self, grid: TokenGrid) -> tuple[list[Rung], int, torch.Tensor | None]:
        """The tables this grid may run, smallest first, the index of the budget's one, and the
        token order they are cut in (:func:`~.mask.tile_order`; ``None``: the model's)."""
        if grid not in self._ladders:
            cfg = self.config
            order = tile_order(grid, cfg.block_size) if cfg.tiles else None
            rungs = ladder(grid, cfg.block_size, cfg.global_blocks, order)
            if cfg.window is None:
                found = (rungs, budget_rung(rungs, cfg.density), order)
            else:
                table = window_table(grid, cfg.block_size, cfg.window, cfg.global_blocks, order)
                own = Rung(cfg.window, table, float(table.float().mean()))
                found = ([own] + [r for r in rungs if r.density > own.density], 0, order)
            self._ladders[grid] = found
        return self._ladders[grid]

    def attend(self, module_index: int, func, args, kwargs, call: dict):
        """Runs one attention call (module docstring)."""
        state, cfg = self.state, self.config
        q, k, v = call["query"], call["key"], call["value"]
        grid = self.grid(q.shape[-2])
        if (call.get("attn_mask") is not None or call.get("dropout_p") or call.get("is_causal") or call.get("enable_gqa")
                or q.shape != k.shape or k.shape != v.shape or q.ndim != 4 or grid is None):
            state.other_calls += 1
            return func(*args, **kwargs)
        info = self.tracker.info
        if info is not None and info.step < cfg.warmup_steps:
            state.warmup_calls += 1
            return func(*args, **kwargs)
        rungs, base, order = self.rungs(grid)
        if order is not None:  # into tiles (text in place); back after the kernel
            q, k, v = (t.index_select(-2, order.to(t.device)) for t in (q, k, v))
        heads = q.shape[1]
        if cfg.adaptive:
            first_video = 0 if order is not None or not grid.text_first else grid.text  # in the tile order, video comes first
            choice = _choose(q, k, v, call.get("scale"), rungs, base, grid, first_video, cfg)
            state.widened_heads += int((choice > base).sum())
            state.dense_heads += int((choice == len(rungs) - 1).sum())  # the last rung is dense
        else:
            choice = torch.full((heads,), base)
        table = torch.stack([rungs[i].table for i in choice.tolist()])
        density = table.float().mean((1, 2))
        state.head_density[module_index] = density
        if float(density.mean()) >= DENSE_ABOVE:
            state.dense_calls += 1
            state.density_sum += 1.0
            return func(*args, **kwargs)
        state.sparse_calls += 1
        state.density_sum += float(density.mean())
        out = block_sparse_attention(q, k, v, table, cfg.block_size, call.get("scale"))
        return out if order is None else out.index_select(-2, torch.argsort(order).to(out.device))


@torch.no_grad()
def _choose(q, k, v, scale, rungs: list[Rung], base: int, grid: TokenGrid, first_video: int,
            cfg: SparseAttentionConfig) -> torch.Tensor:
    """Per head, the index of the first rung from ``base`` up whose output on sampled video query
    rows (the video at positions ``first_video`` onwards) is within ``cfg.error_bound`` (relative
    L2 over batch, rows and channels) of the dense one."""
    rows = first_video + torch.linspace(0, grid.video - 1, min(cfg.sample_rows, grid.video)).round().long().unique()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q[:, :, rows].float() @ k.float().transpose(-1, -2)) * scale  # (batch, heads, rows, tokens)
    values = v.float()
    dense = scores.softmax(-1) @ values
    norm = torch.linalg.vector_norm(dense, dim=(0, 2, 3)).clamp_min(1e-30)
    heads = q.shape[1]
    choice = torch.full((heads,), len(rungs) - 1)
    open_heads = torch.ones(heads, dtype=torch.bool)
    for index in range(base, len(rungs) - 1):
        keep = rungs[index].table[rows // cfg.block_size].repeat_interleave(cfg.block_size, -1)[:, :grid.tokens]
        out = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ values
        passed = open_heads & (torch.linalg.vector_norm(out - dense, dim=(0, 2, 3)) / norm <= cfg.error_bound)
        choice[passed] = index
        open_heads &= ~passed
        if not open_heads.any():
            break
    return choice


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
# torch's own kernel, as imported: a wrapper later put in its place (a profiler's, a library's
# patch) still reaches it, and the mode then sees this function, not the wrapper
_SDPA = F.scaled_dot_product_attention


class _SparseSDPA(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to sparse attention while active."""

    def __init__(self, method: SparseAttention, module_index: int):
        super().__init__()
        self.method, self.module_index = method, module_index

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            return self.method.attend(self.module_index, func, args, kwargs, {**dict(zip(_SDPA_ARGS, args)), **kwargs})
        return func(*args, **kwargs)


class _AttentionHook(ModelHook):
    def __init__(self, method: SparseAttention, module_index: int):
        super().__init__()
        self.method, self.module_index = method, module_index

    # Outside compiled graphs, by design (one break per attention module): the table is chosen
    # per call from the grid, the step and (adaptive) the data, and dynamo cannot trace every op
    # under a TorchFunctionMode (Wan's processor breaks on Tensor.unflatten); the sparse kernel
    # is compiled on its own.
    @torch.compiler.disable
    def new_forward(self, module, *args, **kwargs):
        with _SparseSDPA(self.method, self.module_index):
            return self.fn_ref.original_forward(*args, **kwargs)


class _GridHook(ModelHook):
    """Reads the token grid (frames, rows, columns) of each transformer call."""

    def __init__(self, method: SparseAttention):
        super().__init__()
        self.method = method

    def pre_forward(self, module, *args, **kwargs):
        self.method.shape = self.method.shape_fn(module, args, kwargs)
        return args, kwargs


def check_sparse_attention(model: nn.Module, convert_config=None) -> list[nn.Module]:
    """``model``'s attention modules, after refusing a model sparse attention cannot run on (no
    token grid, no attention processors, another method replacing the attention kernel); changes nothing."""
    spec = spec_for(model)
    if spec.video_shape is None:
        raise ValueError(f"{type(model).__name__} ({spec.name!r}) does not give its token grid (frames, rows, columns): "
                         "sparse attention cannot place its windows; register a ModelSpec with video_shape=..., or leave "
                         "sparse attention off")
    modules = [module for _, _, block, _ in iter_blocks(model, spec)
               for module in block.modules() if callable(getattr(module, "processor", None))]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention modules with a processor inside its blocks: "
                         "sparse attention has nothing to run on (leave it off)")
    other = attention_kernel_clash(NAME, model, convert_config)
    if other is not None:
        raise ValueError(f"sparse attention and the method {other!r} both replace the attention kernel and do not run "
                         f"together yet: keep one (for quantized attention: ConvertConfig.attention=None or "
                         f"sixbit.remove_attention_quant(model))")
    return modules


@changes_model("apply_sparse_attention")
def apply_sparse_attention(model: nn.Module, config: SparseAttentionConfig | None = None) -> SparseAttentionState:
    """Run the self-attention of ``model``'s blocks (or a pipeline's transformer's) block-sparse
    (module docstring); returns the state, whose counters say what ran. Replaces an earlier
    installation; refused (nothing changed) where :func:`check_sparse_attention` refuses."""
    model = transformer_of(model)
    config = config or SparseAttentionConfig()
    if not isinstance(config, SparseAttentionConfig):
        raise ValueError(f"config must be a SparseAttentionConfig, got {type(config).__name__}")
    modules = check_sparse_attention(model)
    remove_sparse_attention(model)
    method = SparseAttention(model, config, track_steps(model))
    hooks.register(model, _GridHook(method), GRID_HOOK_NAME)
    for index, module in enumerate(modules):
        hooks.register(module, _AttentionHook(method, index), HOOK_NAME)
    return method.state


@changes_model("remove_sparse_attention")
def remove_sparse_attention(model: nn.Module) -> None:
    """Run dense attention again (a no-op where sparse attention is not installed)."""
    model = transformer_of(model)
    hooks.remove(model, GRID_HOOK_NAME)
    for module in model.modules():
        hooks.remove(module, HOOK_NAME)


def sparse_attention_of(model: nn.Module) -> SparseAttentionState | None:
    """The state of the sparse attention installed on ``model``, if any."""
    hook = hooks.get(transformer_of(model), GRID_HOOK_NAME)
    return None if hook is None else hook.method.state


def describe_sparse_attention(model: nn.Module) -> str | None:
    """One line for :func:`sixbit.summary`: the settings, the kernel and what ran since the last
    reset; ``None`` where sparse attention is not installed."""
    state = sparse_attention_of(model)
    if state is None:
        return None
    ran = (f"{state.sparse_calls} sparse, {state.dense_calls} dense past the warm-up, {state.warmup_calls} warm-up, "
           f"{state.other_calls} other (cross-attention, masked) calls")
    if state.achieved_density is not None:
        ran += f"; achieved density {state.achieved_density:.2f}"
    if state.config.adaptive:
        ran += f"; {state.widened_heads} head calls widened, {state.dense_heads} of them to dense"
    return f"sparse attention ({state.config.describe()}; {state.path}): {ran}"
