"""Which denoising step, timestep and CFG branch a transformer call belongs to.

:func:`track_steps` registers a diffusers ``ModelHook`` on the transformer. On every call it
reads the ``timestep`` argument and the diffusers cache context (``transformer.cache_context``),
and updates a :class:`StepTracker`:

- **Branch.** The cache-context name when a pipeline sets one: Wan and HunyuanVideo call the
  transformer once per branch inside ``cache_context("cond")`` / ``("uncond")``; CogVideoX,
  LTX-Video and Mochi make one batched call inside ``cache_context("cond_uncond")``
  (:data:`BATCHED`: first half of the batch unconditional, second half conditional — the
  order diffusers concatenates them in). Without a context (a plain sampling loop), a branch
  set with ``with tracker.branch("uncond"):`` wins; otherwise calls are named by their order
  within the step: ``call_order`` (default ``("cond", "uncond")``, diffusers' order), or
  :data:`BATCHED` for every call when the tracker was created with ``batched_cfg=True``.
- **Step.** A call whose timestep equals the previous one belongs to the same step; a
  smaller timestep starts the next step. A context that carries ``step_index`` is used as is.
- **New generation.** A timestep larger than the previous one (the schedule restarted), a
  named branch seen twice at the same step, or the end of a pipeline call (diffusers calls
  ``reset_stateful_hooks`` from ``maybe_free_model_hooks``) starts a new generation and drops
  every per-run state. A plain loop may also call :meth:`StepTracker.new_generation`.

Per-run state of runtime methods lives in :meth:`StepTracker.state`, keyed by owner and branch.

**Precision.** The tracker owns the model's :class:`~sixbit.nn.precision.PrecisionScope`
(``tracker.precision``): runtime methods register their precision policies there, and the
step hook makes it the active scope for the duration of each transformer call, so every
quantized linear inside asks it once which precision it runs at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
from typing import Any, Callable, Iterator

import torch
from diffusers.hooks import ModelHook
from diffusers.hooks.hooks import BaseState, StateManager
from torch import nn

from ..nn import precision
from . import hooks
from .wrapped import changes_model

logger = logging.getLogger(__name__)

HOOK_NAME = "sixbit_step_context"
BATCHED = "cond_uncond"


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """Where the current transformer call is in the sampling loop."""

    step: int  # 0-based denoising step within the current generation
    timestep: float  # the timestep value passed to the transformer
    branch: str  # "cond", "uncond", BATCHED, or the pipeline's cache-context name
    call: int  # index of this call within the step (0 for the first branch)
    generation: int  # counts generations since the tracker was created
    num_steps: int | None = None  # steps of this generation, when the pipeline's cache context says

    def batch_branches(self, batch_size: int) -> list[str]:
        """The branch of each sample: batched CFG splits the batch into uncond | cond halves."""
        if self.branch != BATCHED:
            return [self.branch] * batch_size
        if batch_size % 2:
            raise ValueError(f"a batched-CFG call needs an even batch, got {batch_size}")
        return ["uncond"] * (batch_size // 2) + ["cond"] * (batch_size // 2)


class StepTracker:
    """Step, timestep and branch of the current call, plus per-run state keyed by branch.

    Args:
        batched_cfg: calls made without a cache context carry both CFG branches in one batch
            (uncond first). Default ``False``: such calls are named by ``call_order``.
        call_order: branch names of the 1st, 2nd, … context-less call within one step.
    """

    def __init__(self, batched_cfg: bool = False, call_order: tuple[str, ...] = ("cond", "uncond")):
        self.batched_cfg = batched_cfg
        self.call_order = tuple(call_order)
        self.info: StepInfo | None = None
        self._generation = -1
        self._seen: set[str] = set()
        self._explicit: str | None = None
        self._states: dict[tuple[int, str], Any] = {}
        self._listeners: list[Callable[[], None]] = []
        self.precision = precision.PrecisionScope()

    # ------------------------------------------------------------------ events

    def observe(self, timestep: float, context: Any = None) -> StepInfo:
        """Register a transformer call (``context``: diffusers' ``CacheContext``, or ``None``); returns its :class:`StepInfo`."""
        name = getattr(context, "name", None) or self._explicit
        step_index = getattr(context, "step_index", None)
        prev = self.info
        if prev is None:
            self._start()
            step, call = 0, 0
        elif step_index is not None and step_index < prev.step:
            self._start()
            step, call = step_index, 0
        elif step_index is not None and step_index > prev.step:
            step, call = step_index, 0
            self._seen = set()
        elif timestep > prev.timestep:
            self._start()
            step, call = 0, 0
        elif timestep < prev.timestep and step_index is None:
            step, call = prev.step + 1, 0
            self._seen = set()
        elif name is not None and name in self._seen:  # same branch twice at one step: a new run
            self._start()
            step, call = step_index or 0, 0
        else:
            step, call = prev.step, prev.call + 1
        if name is None:
            name = BATCHED if self.batched_cfg else (
                self.call_order[call] if call < len(self.call_order) else f"call{call}"
            )
        self._seen.add(name)
        num_steps = getattr(context, "num_inference_steps", None)
        if num_steps is None and prev is not None and prev.generation == self._generation:
            num_steps = prev.num_steps
        self.info = StepInfo(step, float(timestep), name, call, self._generation, num_steps)
        return self.info

    def new_generation(self) -> None:
        """Forget the current run: the next call is step 0 of a new generation."""
        self.info = None
        self._seen = set()
        self._states.clear()
        for fn in self._listeners:
            fn()

    def _start(self) -> None:
        self.new_generation()
        self._generation += 1

    def on_new_generation(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` whenever per-run state is dropped."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[], None]) -> None:
        """Stop calling ``fn`` (registered with :meth:`on_new_generation`)."""
        self._listeners = [f for f in self._listeners if f != fn]

    # ------------------------------------------------------------------ state

    def state(self, owner: object, factory: Callable[[], Any], branch: str | None = None) -> Any:
        """The per-run state of ``owner`` for ``branch`` (default: the current call's branch)."""
        if branch is None:
            if self.info is None:
                raise RuntimeError("no transformer call is in progress: per-branch state is undefined")
            branch = self.info.branch
        key = (id(owner), branch)
        if key not in self._states:
            self._states[key] = factory()
        return self._states[key]

    def branch_states(self, owner: object) -> list[Any]:
        """Every branch's per-run state of ``owner`` created so far in the current run."""
        return [state for (key, branch), state in self._states.items() if key == id(owner) and branch is not None]

    def shared_state(self, owner: object, factory: Callable[[], Any]) -> Any:
        """Per-run state of ``owner`` shared by all branches."""
        key = (id(owner), None)
        if key not in self._states:
            self._states[key] = factory()
        return self._states[key]

    @contextlib.contextmanager
    def branch(self, name: str) -> Iterator[None]:
        """Name the branch of the calls made inside, for plain loops without a cache context."""
        previous, self._explicit = self._explicit, name
        try:
            yield
        finally:
            self._explicit = previous


class RunReports:
    """The report of the run in progress, and of the last finished run once a new one starts.

    ``factory()`` builds an empty report (anything with a ``decisions`` mapping). Registered on
    the tracker, so a pipeline's end-of-call reset keeps the finished run's report readable.
    ``on_finish(report)``, where given, sees every finished run's report.
    """

    def __init__(self, tracker: StepTracker, factory: Callable[[], Any],
                 on_finish: Callable[[Any], None] | None = None):
        self.tracker, self._factory, self._on_finish = tracker, factory, on_finish
        self.current = factory()
        self._last = None
        tracker.on_new_generation(self._finish)

    def _finish(self) -> None:
        if self.current.decisions:
            if self._on_finish is not None:
                self._on_finish(self.current)
            self._last, self.current = self.current, self._factory()

    def get(self):
        return self.current if self.current.decisions or self._last is None else self._last

    def detach(self) -> None:
        """Stop following the tracker (when the method is removed)."""
        self.tracker.remove_listener(self._finish)


class _Observed(BaseState):
    def reset(self, *args, **kwargs) -> None:
        pass


class ContextRecorder(StateManager):
    """Keeps the ``CacheContext`` (name, step index, step count) diffusers hands the
    StateManagers of stateful hooks inside ``transformer.cache_context(...)``: a stateful hook
    that holds one as an attribute reads the current context from its ``current``."""

    def __init__(self):
        super().__init__(_Observed)
        self.current: Any = None

    def set_context(self, context) -> None:
        super().set_context(context)
        self.current = context

    def reset(self, *args, **kwargs) -> None:
        super().reset(*args, **kwargs)
        self.current = None


class _StepHook(ModelHook):
    _is_stateful = True

    def __init__(self, tracker: StepTracker, timestep_index: int | None):
        super().__init__()
        self.tracker = tracker
        self.timestep_index = timestep_index
        self.context = ContextRecorder()

    def new_forward(self, module, *args, **kwargs):
        t = kwargs.get("timestep")
        if t is None and self.timestep_index is not None and self.timestep_index < len(args):
            t = args[self.timestep_index]
        if t is None:
            raise ValueError(
                f"{type(module).__name__} was called without a `timestep` argument; sixbit's step "
                "tracking needs it (pass timestep=... as diffusers pipelines do)"
            )
        _observe(self.tracker, t, self.context.current)
        with precision.active(self.tracker.precision):
            return self.fn_ref.original_forward(*args, **kwargs)

    def reset_state(self, module):
        self.tracker.new_generation()
        return module


@torch.compiler.disable
def _observe(tracker: StepTracker, t, context) -> None:
    # reads the timestep back to the host: once per transformer call, outside compiled graphs
    tracker.observe(float(t.reshape(-1)[0]) if isinstance(t, torch.Tensor) else float(t), context)


@changes_model("track_steps")
def track_steps(model: nn.Module, batched_cfg: bool | None = None) -> StepTracker:
    """Install (once) the step-tracking hook on ``model`` and return its :class:`StepTracker`.

    Example:
        >>> tracker = track_steps(transformer)            # doctest: +SKIP
        >>> for t in scheduler.timesteps:                  # doctest: +SKIP
        ...     cond = transformer(x, timestep=t, encoder_hidden_states=c)   # branch "cond"
        ...     uncond = transformer(x, timestep=t, encoder_hidden_states=u) # branch "uncond"
        ...     tracker.info.step
    """
    existing = tracker_of(model)
    if existing is not None:
        if batched_cfg is not None:
            existing.batched_cfg = batched_cfg
        return existing
    params = list(inspect.signature(model.forward).parameters)
    index = params.index("timestep") if "timestep" in params else None
    tracker = StepTracker(batched_cfg=bool(batched_cfg))
    hooks.register(model, _StepHook(tracker, index), HOOK_NAME)
    return tracker


def tracker_of(model: nn.Module) -> StepTracker | None:
    """The :class:`StepTracker` installed on ``model``, or ``None``."""
    hook = hooks.get(model, HOOK_NAME)
    return hook.tracker if hook is not None else None
