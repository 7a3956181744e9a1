"""The driver behind ``TensorParallelWrapper(model, device_ids=[0, 1])`` in a plain process
(one file past 380 lines: the caller's side of one request protocol; the deadlines are apart).

With no process group in the calling process (a script, a notebook), the wrapper starts one
worker process per device and drives them; the caller keeps its pipeline and its loops:

- **Start.** The transformer (converted or not, with its runtime methods and LoRAs) is written
  once to a temporary file (:mod:`.handover`: ``torch.save``, ``cloudpickle`` for hooks), and
  ``N`` workers start with ``torch.multiprocessing`` (spawn). Each one loads the file memory-
  mapped, joins a process group (NCCL on GPUs, gloo on CPUs, over a file store), and splits the
  model as under ``torchrun`` (:mod:`.tensor` or :mod:`.sequence`): it keeps its shard, and the
  file is removed once every worker holds one. CPU workers take an equal share of this
  process's cores (``torch.set_num_threads``).
- **Calls.** A hook on the caller's transformer (:class:`DriverHook`, outermost) sends each
  call's inputs and diffusers cache context to every worker; each runs the call on its device
  and rank 0 sends the output back, to the device the inputs came from. The end of a pipeline
  call (diffusers' ``reset_stateful_hooks``) reaches the workers too, so runtime methods start a
  new generation there as they would here. Calls run without autograd: inference only. A call
  (or ``sixbit.save``) after the model changed here is refused (:mod:`.handover`).
- **Errors.** An exception in a worker is raised here, the same exception with the worker's
  traceback as its cause. A worker that ends, an error or a ``KeyboardInterrupt`` while the
  workers run stops them all (their collectives are mid-call): the wrapper refuses calls after
  that, and ``close()`` gives the model back to run here. Ctrl-C while they run kills them
  before ``KeyboardInterrupt`` is raised here, and a wait past ``$SIXBIT_WORKER_TIMEOUT`` seconds
  stops them with a :class:`WorkerError` (:mod:`.deadlines`).
- **Stop.** ``close()``, garbage collection of the wrapper (the model does not keep it) and
  interpreter exit stop the workers; workers ignore SIGINT (Ctrl-C is the caller's to handle) and
  are killed by the kernel if the caller dies (Linux ``PR_SET_PDEATHSIG``).

The caller's own transformer stays whole in its memory (it is what ``sixbit.save`` writes and
what ``close()`` gives back); the workers hold the shards.

Workers are spawned, not forked: a forked child that runs OpenMP with more than one thread
hangs (GNU libgomp; seen here), and CUDA refuses to run in a forked child of a process that
used it. Spawn would run the caller's script again in each worker unless it is guarded by
``if __name__ == "__main__":``; the workers need nothing from it, so it is not run there.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
import types
import weakref
from collections.abc import Iterator
from multiprocessing.connection import wait

import cloudpickle
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

from ..lora import linear_factors, set_linear_factors
from ..memory.devices import compute_device
from ..runtime import hooks
from ..runtime.context import ContextRecorder
from .deadlines import ended, expired, killed_on_ctrl_c, timeout
from .handover import Handed, write

logger = logging.getLogger(__name__)

HOOK_NAME = "sixbit_parallel_driver"
_STOP_SECONDS = 10.0  # a worker asked to stop that has not ended by then is killed


def devices(device_ids) -> list[torch.device]:
    """``device_ids`` as devices, one per worker: CUDA indices where this machine has GPUs, CPU
    workers where it has none (``[0, 1]``: two CPU workers), or device names (``["cpu", "cpu"]``,
    ``["cuda:0", "cuda:1"]``)."""
    if isinstance(device_ids, (str, int, torch.device)) or not hasattr(device_ids, "__iter__"):
        raise ValueError(f"device_ids is a list with one device per worker, e.g. [0, 1] or ['cpu', 'cpu']; "
                         f"got {device_ids!r}")
    found = []
    for d in device_ids:
        if isinstance(d, int) and not isinstance(d, bool) and d >= 0:  # an index: a GPU, or a CPU worker without GPUs
            d = f"cuda:{d}" if torch.cuda.is_available() else "cpu"
        found.append(compute_device(d, f"device_ids[{len(found)}] is {d!r}", "give a CUDA index (0, 1, …), 'cpu' or "
                                    "'cuda:N' (plain indices mean CPU workers on a machine without GPUs)"))
    if not found:
        raise ValueError("device_ids is empty: give one device per worker, e.g. [0, 1]")
    if len({d.type for d in found}) > 1:
        raise ValueError(f"device_ids mixes CPU and CUDA devices ({[str(d) for d in found]}): every worker runs on "
                         "the same kind of device")
    cuda = [d.index for d in found if d.type == "cuda"]
    if len(set(cuda)) < len(cuda):
        raise ValueError(f"device_ids names a GPU twice ({cuda}): one worker per GPU")
    return found


def _to(obj, device: torch.device | str):
    """``obj`` with every tensor inside (tuples, lists, dicts, dataclasses) on ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _to(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_to(v, device) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(v, device) for v in obj)
    if isinstance(obj, dict):
        return type(obj)({k: _to(v, device) for k, v in obj.items()})
    return obj


def _first_device(obj) -> torch.device | None:
    if isinstance(obj, torch.Tensor):
        return obj.device
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (tuple, list)) else ()
    return next((d for d in map(_first_device, values) if d is not None), None)


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (the cause of the exception raised here)."""

    def __str__(self) -> str:
        return self.args[0]


class WorkerError(RuntimeError):
    """A worker failed, or ended, and its exception could not be raised here as it was."""


# ---------------------------------------------------------------------------------- worker side


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when the caller ends, however it ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def _reply(conn, value) -> None:
    conn.send_bytes(cloudpickle.dumps(("ok", value)))


def _fail(conn, error: BaseException) -> None:
    text = "".join(traceback.format_exception(error))
    try:
        payload = cloudpickle.dumps(("error", error, text))
        pickle.loads(payload)  # an exception that cannot be rebuilt here is sent as text
    except Exception:
        payload = cloudpickle.dumps(("error", None, text))
    conn.send_bytes(payload)


def _call(wrapper, device: torch.device, rank: int, args, kwargs, context):
    transformer = wrapper.transformer
    args, kwargs = _to(args, device), _to(kwargs, device)
    fields = {} if context is None else {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
    with torch.no_grad(), (transformer.cache_context(**fields) if context is not None else contextlib.nullcontext()):
        out = transformer(*args, **kwargs)
    return _to(out, "cpu") if rank == 0 else None


def _serve(conn, wrap, rank: int, world: int, device: torch.device, mode: str, chunk_size: int | None,
           model_path: str, store: str, threads: int, parent: int) -> None:
    """A worker: join the group, load the model and split it (``wrap``: the wrapper class, under
    this worker's process group), then answer the caller until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent)
    try:
        torch.set_num_threads(threads)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.FileStore(store, world),
                                rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout()))
        transformer, factors = torch.load(model_path, mmap=True, weights_only=False)
        set_linear_factors(transformer, factors)
        wrapper = wrap(transformer, device_ids=[device.index] * world if device.type == "cuda" else None,
                       mode=mode, chunk_size=chunk_size)
        _reply(conn, {"pid": os.getpid(), "threads": torch.get_num_threads()})
    except BaseException as e:  # noqa: BLE001 - everything goes back to the caller
        _fail(conn, e)
        return
    while True:
        try:
            op, payload = pickle.loads(conn.recv_bytes())
        except EOFError:  # the caller is gone
            break
        if op == "stop":
            break
        try:
            if op == "call":
                value = _call(wrapper, device, rank, *payload)
            elif op == "reset":
                HookRegistry.check_if_exists_or_initialize(wrapper.transformer).reset_stateful_hooks()
                value = None
            else:  # "run": a function of the wrapper, on every worker
                fn, args = payload
                value = _to(fn(wrapper, *args), "cpu")
            _reply(conn, value)
        except BaseException as e:  # noqa: BLE001
            _fail(conn, e)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------- caller side


@contextlib.contextmanager
def _script_not_rerun() -> Iterator[None]:
    """While workers spawn: hide the caller's ``__main__``, which spawn would import again in each
    worker (running an unguarded script's wrapping line again there)."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _threads(world: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world)


def _stop(processes: list, conns: list, folder: str, graceful: bool) -> None:
    """End every worker (asked first when ``graceful``, killed past :data:`_STOP_SECONDS`) and
    remove the temporary folder. Safe to run twice."""
    if graceful:
        for conn in conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send_bytes(pickle.dumps(("stop", None)))
        for p in processes:
            p.join(_STOP_SECONDS)
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join()
    for conn in conns:
        conn.close()
    shutil.rmtree(folder, ignore_errors=True)


class Driver:
    """``N`` worker processes holding a split copy of ``transformer`` (see the module doc); each
    splits its copy with ``wrap`` (the TensorParallelWrapper class) under its process group."""

    def __init__(self, transformer: nn.Module, devices: list[torch.device], mode: str, chunk_size: int | None, wrap):
        if any(d.type == "cuda" for d in devices) and not dist.is_nccl_available():
            raise ValueError("this PyTorch build has no NCCL, which workers on GPUs need")
        self.world, self.devices = len(devices), devices
        self.failed: str | None = None
        self._folder = folder = tempfile.mkdtemp(prefix="sixbit-workers-")
        self.processes, self.conns = [], []
        # runs at close(), garbage collection and interpreter exit: no worker outlives the wrapper
        self._finalizer = weakref.finalize(self, _stop, self.processes, self.conns, folder, True)
        try:
            model_path = os.path.join(folder, "model.pt")
            self.handed = Handed.of(transformer)  # what a later change here is checked against
            write(transformer, linear_factors(transformer), model_path)
            context = mp.get_context("spawn")
            threads = _threads(self.world) if devices[0].type == "cpu" else 1
            with _script_not_rerun():
                for rank, device in enumerate(devices):
                    mine, theirs = context.Pipe()
                    p = context.Process(target=_serve, name=f"sixbit-worker-{rank}", daemon=True,
                                        args=(theirs, wrap, rank, self.world, device, mode, chunk_size, model_path,
                                              os.path.join(folder, "store"), threads, os.getpid()))
                    p.start()
                    theirs.close()
                    self.processes.append(p)
                    self.conns.append(mine)
            logger.info("started %d workers (%s), loading the model", self.world, ", ".join(map(str, devices)))
            self.workers = self._replies()
            os.unlink(model_path)  # every worker holds its shard now
        except BaseException:
            self._finalizer.detach()
            _stop(self.processes, self.conns, folder, graceful=False)
            raise

    @property
    def alive(self) -> bool:
        return self._finalizer.alive and self.failed is None

    def call(self, args: tuple, kwargs: dict, context) -> object:
        """One transformer call on the workers; its output on the device the inputs are on."""
        device = _first_device((args, kwargs))
        out = self._ask("call", (_to(args, "cpu"), _to(kwargs, "cpu"), context))[0]
        return out if device is None or device.type == "cpu" else _to(out, device)

    def reset(self) -> None:
        """The end of a generation (diffusers' ``reset_stateful_hooks``), on every worker."""
        if self.alive:
            self._ask("reset", None)

    def run(self, fn, *args) -> list:
        """``fn(wrapper, *args)`` on every worker (its wrapper of its shard); each one's result."""
        return self._ask("run", (fn, args))

    def close(self) -> None:
        """Stop the workers (asked, then killed if they do not end)."""
        self._finalizer()

    def _ask(self, op: str, payload) -> list:
        if not self.alive:
            raise RuntimeError(f"the workers of this TensorParallelWrapper are stopped"
                               f"{' (' + self.failed + ')' if self.failed else ''}: call close() to run the model in "
                               "this process, or close() and wrap it again")
        data = cloudpickle.dumps((op, payload))
        try:
            with killed_on_ctrl_c(self.processes):
                for rank, conn in enumerate(self.conns):
                    if not self.processes[rank].is_alive():  # it ended (killed, crashed) since the last request
                        raise WorkerError(ended(rank, self.processes[rank], f"before it was sent a {op}"))
                    try:
                        conn.send_bytes(data)
                    except OSError:  # ended since the line above: a broken pipe
                        raise WorkerError(ended(rank, self.processes[rank], f"before it was sent a {op}")) from None
                return self._replies(op)
        except BaseException as e:  # a worker's error, a worker gone, Ctrl-C: the others are mid-collective
            self.failed = f"{type(e).__name__} during a {op}"
            self._finalizer.detach()
            _stop(self.processes, self.conns, self._folder, graceful=False)
            raise

    def _replies(self, op: str = "start") -> list:
        """Every worker's answer, in rank order; the first error raised as the worker raised it,
        :class:`WorkerError` past :func:`~.deadlines.timeout` seconds (the caller stops them)."""
        replies = [None] * self.world
        waiting = {conn: rank for rank, conn in enumerate(self.conns)}
        sentinels = {p.sentinel: rank for rank, p in enumerate(self.processes)}
        deadline = time.monotonic() + timeout()
        while waiting:
            ready_now = wait([*waiting, *sentinels], timeout=max(0.0, deadline - time.monotonic()))
            if not ready_now:
                raise WorkerError(expired(op, sorted(waiting.values())))
            for ready in ready_now:
                if ready in sentinels:
                    rank = sentinels[ready]
                    if self.conns[rank] in waiting and not self.conns[rank].poll():
                        raise WorkerError(ended(rank, self.processes[rank], "before it answered"))
                    continue
                rank = waiting.pop(ready)
                try:
                    reply = pickle.loads(ready.recv_bytes())
                except (EOFError, OSError):  # it ended (killed, crashed) before it answered: EOF or a reset
                    raise WorkerError(ended(rank, self.processes[rank], "before it answered")) from None
                if reply[0] == "error":
                    _, error, text = reply
                    if error is None:
                        raise WorkerError(f"worker {rank} failed:\n{text}")
                    raise error from RemoteTraceback(f"\n\nin worker {rank}:\n{text}")
                replies[rank] = reply[1]
        return replies



class DriverHook(ModelHook):
    """On the caller's transformer, outermost: every call runs on the workers instead of here."""

    _is_stateful = True  # diffusers' reset_stateful_hooks reaches it at the end of a pipeline call

    def __init__(self, driver: Driver):
        super().__init__()
        self.driver = driver
        self.context = ContextRecorder()  # the pipeline's cache_context(...), sent with each call

    def new_forward(self, module, *args, **kwargs):
        self.driver.handed.check(module, "call it")
        return self.driver.call(args, kwargs, self.context.current)

    def reset_state(self, module):
        self.driver.reset()
        return module


def attach(transformer: nn.Module, driver: Driver) -> None:
    """Route ``transformer``'s calls to ``driver``'s workers."""
    hooks.register(transformer, DriverHook(driver), HOOK_NAME)


def detach(transformer: nn.Module) -> None:
    """Run ``transformer`` here again."""
    hooks.remove(transformer, HOOK_NAME)


__all__ = ["Driver", "DriverHook", "RemoteTraceback", "WorkerError", "attach", "detach", "devices"]
