"""The seed's call in one plain process: ``TensorParallelWrapper(model, device_ids=[0, 1],
chunk_size=32)`` starts two CPU workers (gloo) and gives the unwrapped model's videos and
outputs bit for bit; no worker outlives the wrapper, however it ends."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import sixbit
from sixbit.methods.delta_cache import DeltaCache, DeltaCacheConfig
from sixbit.nn import QuantLinear
from sixbit.parallel import (
    TensorParallelWrapper,
    deadlines,
    driver,
    feed_forward,
    handover,
)
from sixbit.presets import resolve
from sixbit.runtime import blocks
from sixbit.zoo.shapes import load_pipeline

pytestmark = pytest.mark.deadline(900)  # every test here starts processes (about 1 min each on 2 loaded cores)
SCRIPT = Path(__file__).with_name("driver_script.py")
PROMPT = ["a red circle moving right"]


def video(pipe, steps: int = 4) -> np.ndarray:
    return pipe(PROMPT, num_inference_steps=steps, guidance_scale=4.0,
                generator=[torch.Generator().manual_seed(0)]).frames


def gone(pids, seconds: float = 15.0) -> bool:
    """Whether every process in ``pids`` has ended (a zombie counts as ended), within ``seconds``."""
    def alive(pid):
        try:
            return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return False
    deadline = time.monotonic() + seconds
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(alive, pids))


def pids_of(wrapper) -> list[int]:
    return wrapper.on_workers(lambda w: os.getpid())


@pytest.fixture
def workers_threads():
    """This process at each CPU worker's thread count (the driver's share of the cores) while a
    test compares bits: a BLAS may round a GEMM differently at another thread count (MKL on an AMD
    EPYC without AMX: a 10-row SGEMM, 1 against 2 threads, up to 3e-5), and "the same video" is the
    single process's at the same thread count (README, parallel)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(driver._threads(2))
    yield torch.get_num_threads()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("arch, preset, mode, chunk_size", [
    ("wan", None, "tensor", 32),        # the seed's call, full precision
    ("wan", "w8a8", "tensor", 32),      # the seed's call, quantized
    ("cogvideox", "tdc", "sequence", None),  # a runtime method (the delta cache) across generations
])
def test_the_seed_call_gives_the_unwrapped_video(arch, preset, mode, chunk_size, tmp_path, workers_threads):
    pipe = load_pipeline(arch)
    if preset == "tdc":  # a threshold at which the cache skips blocks within the few steps
        sixbit.convert_model(pipe, None, dataclasses.replace(resolve("tdc"), cache=DeltaCacheConfig(threshold=0.4)))
    elif preset is not None:
        sixbit.convert_model(pipe, None, preset)
    # the cache needs steps to skip within, and steps in its second generation to meet a stale state
    # in; Wan has no state across calls, so one step shows a second generation (and its steps cost most)
    steps, second = (10, 3) if preset == "tdc" else (2, 1)
    skipped = lambda w: sum(d == "skip" for cache in blocks.attached(w.transformer, DeltaCache)  # noqa: E731
                            for d in cache.report().decisions.values())
    want = [video(pipe, steps)]
    skips_here = skipped(types.SimpleNamespace(transformer=pipe.transformer))
    want.append(video(pipe, steps=second))
    wrapped = TensorParallelWrapper(pipe, device_ids=[0, 1], mode=mode, chunk_size=chunk_size)
    try:
        workers = pids_of(wrapped)
        assert len(set(workers)) == 2 and os.getpid() not in workers
        assert wrapped.on_workers(lambda w: torch.get_num_threads()) == [workers_threads] * 2
        got = [video(wrapped, steps)]
        if preset == "tdc":  # the cache ran in the workers, and skipped there as here
            assert wrapped.on_workers(skipped) == [skips_here] * 2 and skips_here > 0
        got.append(video(wrapped, steps=second))  # a second generation: the end of the first reached the workers
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
        if mode == "tensor":
            whole = sum(t.numel() * t.element_size() for t in (*pipe.transformer.parameters(), *pipe.transformer.buffers()))
            assert wrapped.weight_bytes() <= 0.55 * whole
        if preset == "w8a8":  # this process kept the whole model: it writes the one checkpoint
            path = sixbit.save(wrapped, tmp_path / "m.safetensors")
            fresh = load_pipeline(arch)
            sixbit.load(path, fresh)
            assert np.array_equal(video(fresh, steps), want[0])
    finally:
        back = wrapped.close()
    assert gone(workers)
    assert back is pipe and np.array_equal(video(pipe, steps), want[0])  # runs here again, whole


@pytest.mark.parametrize("preset", [None, "w8a8"])
def test_a_plain_loop_with_a_lora_and_garbage_collection(preset, workers_threads):
    """A bare transformer (full precision, or converted) with a LoRA on every linear, called in a
    plain loop; the wrapper dropped without close(): its workers end."""
    transformer = load_pipeline("cogvideox").transformer
    if preset is not None:
        sixbit.convert_model(transformer, None, preset)
    g = torch.Generator().manual_seed(3)
    linears = [(n, m) for n, m in transformer.named_modules() if isinstance(m, (torch.nn.Linear, QuantLinear))]
    assert {type(m).__name__ for _, m in linears} == ({"Linear"} if preset is None else {"Linear", "QuantLinear"})
    sixbit.load_lora(transformer, {
        **{f"{n}.lora_A.weight": torch.randn(2, m.in_features, generator=g) / m.in_features ** 0.5 for n, m in linears},
        **{f"{n}.lora_B.weight": 0.05 * torch.randn(m.out_features, 2, generator=g) for n, m in linears}})
    x = torch.randn(2, 4, 3, 32, 32, generator=g)  # 4 latent frames in 2 × 8 × 8 patches: 128 video tokens
    text = torch.randn(2, 8, transformer.config.text_embed_dim, generator=g)

    def loop(model):
        latents, outs = x.clone(), []
        with torch.no_grad():
            for t in (900, 600, 300):
                out = model(hidden_states=latents, encoder_hidden_states=text, timestep=torch.tensor([t, t]),
                            return_dict=False)[0]
                latents = latents - 0.1 * out
                outs.append(out)
        return outs

    want = loop(transformer)
    wrapped = TensorParallelWrapper(transformer, device_ids=[0, 1], chunk_size=32)
    workers = pids_of(wrapped)
    assert all(torch.equal(a, b) for a, b in zip(loop(wrapped), want))
    with pytest.raises(ValueError, match="load the LoRA before wrapping"):
        sixbit.load_lora(transformer, {})
    del wrapped, transformer
    gc.collect()
    assert gone(workers)


def test_bad_arguments_are_refused_before_any_worker_starts():
    pipe = load_pipeline("wan")  # 4 heads
    with pytest.raises(ValueError, match="mixes CPU and CUDA") if torch.cuda.is_available() else \
            pytest.raises(ValueError, match="no CUDA device"):
        TensorParallelWrapper(pipe, device_ids=["cpu", "cuda:0"])
    with pytest.raises(ValueError, match="device_ids is a list"):
        TensorParallelWrapper(pipe, device_ids=2)
    with pytest.raises(ValueError, match="chunk_size is the number of tokens"):
        TensorParallelWrapper(pipe, device_ids=[0, 1], chunk_size=0)
    with pytest.raises(ValueError, match="4 attention heads, which do not divide across 3 ranks"):
        TensorParallelWrapper(pipe, device_ids=[0, 1, 2])
    with pytest.raises(ValueError, match="group names a process group"):
        TensorParallelWrapper(pipe, device_ids=[0, 1], group=object())
    nvfp4, w4a4 = load_pipeline("wan"), resolve("w4a4")
    sixbit.convert_model(nvfp4, None, dataclasses.replace(w4a4, weights=dataclasses.replace(w4a4.weights, gptq=False)))
    with pytest.raises(ValueError, match="NVFP4 with one scale over all of a call's tokens"):
        TensorParallelWrapper(nvfp4, device_ids=[0, 1], chunk_size=32)
    steady = sixbit.convert_model(load_pipeline("wan"), None, "w8a8", stabilize_frames=True)
    with pytest.raises(ValueError, match="frame stabilizer .* splits each call's video tokens by frame"):
        TensorParallelWrapper(steady, device_ids=[0, 1], chunk_size=32)
    assert not multiprocessing.active_children()
    assert sixbit.parallel.wrapper_of(pipe.transformer) is None


def test_chunks_reproduce_whole_feed_forwards_in_one_process():
    transformer = load_pipeline("cogvideox").transformer
    sixbit.convert_model(transformer, None, "w8a8")
    g = torch.Generator().manual_seed(0)
    inputs = {"hidden_states": torch.randn(2, 4, 3, 32, 32, generator=g), "timestep": torch.tensor([500, 500]),
              "encoder_hidden_states": torch.randn(2, 8, transformer.config.text_embed_dim, generator=g),
              "return_dict": False}
    with torch.no_grad():
        want = transformer(**inputs)[0]
        names = feed_forward.chunk(transformer, 7)  # 8 text + 128 video tokens: 20 chunks, the last one short
        got = transformer(**inputs)[0]
    assert len(names) == len(transformer.transformer_blocks) and torch.equal(got, want)
    feed_forward.unchunk(transformer)
    assert all(not sixbit.runtime.hooks.names(m) for m in feed_forward.feed_forwards(transformer).values())


def _run_script(case: str, interrupt: float | None = None, seconds: float = 300) -> list[dict]:
    """The script's events, exit code and stderr, Ctrl-C'd ``interrupt`` seconds into its
    generation if given; past ``seconds`` after the Ctrl-C (or the module's deadline before it)
    TimeoutExpired / TimeoutError, and its process group is killed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), case], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    events = []
    try:
        for line in proc.stdout:
            if line.startswith("{"):
                events.append(json.loads(line))
                if interrupt is not None and events[-1].get("generating"):
                    time.sleep(interrupt)
                    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
                    break
        out, err = proc.communicate(timeout=seconds)
        events += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return events, proc.returncode, err


def test_an_error_in_a_worker_is_raised_here_and_exit_leaves_no_worker():
    events, code, err = _run_script("error")
    assert code == 0, err[-3000:]
    first, raised, after, second = events
    assert raised["raised"] == "ValueError" and raised["message"] == "injected failure in rank 1"
    assert "in worker 1" in raised["cause"] and "boom" in raised["cause"]  # the worker's traceback
    assert "workers of this TensorParallelWrapper are stopped" in after["after"]
    assert gone(first["pids"]) and gone(second["pids"])  # the second was never closed: exit stopped it


@contextlib.contextmanager
def load(processes: int = 2, seconds: float = 600):
    """Other processes spinning on every core meanwhile (each ends by itself after ``seconds``)."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(timeout=30)


@pytest.mark.parametrize("after", [0.0, 0.6, 2.5])
def test_ctrl_c_in_the_caller_leaves_no_worker(after):
    """Issue 61: a Ctrl-C that lands while the two ranks are in different collectives hung the
    caller and both workers. Ctrl-C'd at several points of a generation, on loaded cores: the caller
    exits with KeyboardInterrupt and no worker is left (the module's deadline catches a hang)."""
    with load():
        events, code, err = _run_script("interrupt", interrupt=after)
    assert "KeyboardInterrupt" in err and code != 0
    assert gone(events[0]["pids"])


def test_a_wait_past_the_timeout_stops_the_workers_with_a_clear_error(monkeypatch):
    wrapped = TensorParallelWrapper(load_pipeline("wan"), device_ids=[0, 1])
    workers = pids_of(wrapped)
    monkeypatch.setenv(deadlines.TIMEOUT, "2")  # the caller's wait; the workers' collectives keep theirs
    with pytest.raises(driver.WorkerError, match=r"did not answer a run within 2 s \(\$SIXBIT_WORKER_TIMEOUT\)"):
        wrapped.on_workers(lambda w: time.sleep(600))
    assert gone(workers)
    with pytest.raises(RuntimeError, match="WorkerError during a run"):
        wrapped.on_workers(lambda w: None)
    wrapped.close()


@pytest.mark.parametrize("swallowed", [False, True])
def test_ctrl_c_while_the_workers_run_stops_them_all_first(swallowed):
    """Ctrl-C kills the workers before the caller's handler runs: a caller that swallows it (here a
    handler that returns; in the report, KeyboardInterrupt lost inside code that ignores it) is
    not left waiting, the call fails."""
    wrapped = TensorParallelWrapper(load_pipeline("wan"), device_ids=[0, 1])
    workers, handler = pids_of(wrapped), signal.getsignal(signal.SIGINT)
    seen = []
    if swallowed:
        signal.signal(signal.SIGINT, lambda *_: seen.append("ctrl-c"))
    installed = signal.getsignal(signal.SIGINT)
    ctrl_c = threading.Timer(3, os.kill, (os.getpid(), signal.SIGINT))
    ctrl_c.start()
    try:
        with pytest.raises(driver.WorkerError if swallowed else KeyboardInterrupt):
            wrapped.on_workers(lambda w: time.sleep(600))
        assert seen == (["ctrl-c"] if swallowed else [])
        assert gone(workers) and signal.getsignal(signal.SIGINT) is installed  # the caller's own again
    finally:
        ctrl_c.cancel()
        signal.signal(signal.SIGINT, handler)
    wrapped.close()


def refuse_changes(pipe, wrapped) -> None:
    """Each sixbit call that changes the model is refused, naming close(), and changes nothing."""
    x = pipe.transformer
    before = (sixbit.loras(pipe), dict(sixbit.lora.lora_state(pipe).scales), sixbit.runtime.hooks.names(x))
    changes = {
        "set_lora_scale": lambda: sixbit.set_lora_scale(pipe, 0.5),
        "unload_lora": lambda: sixbit.unload_lora(wrapped),
        "switch LoRAs on or off": lambda: x.disable_lora(),  # diffusers' pipe.disable_lora() lands here
        "enable_delta_cache": lambda: sixbit.enable_delta_cache(x, DeltaCacheConfig(threshold=0.4)),
        "enable_memory_optimization": lambda: sixbit.memory.enable_memory_optimization(pipe),
        "keep_int8_weights": lambda: sixbit.keep_int8_weights(model=x),
        "quantize the model": lambda: sixbit.quantize(x, sixbit.QuantConfig(weight_format="int8")),
        "convert the model": lambda: sixbit.convert_model(pipe, None, "w4a8-rtn"),
    }
    for what, change in changes.items():
        with pytest.raises(ValueError, match=rf"{what} before wrapping.*wrapper\.close\(\)"):
            change()
    assert (sixbit.loras(pipe), dict(sixbit.lora.lora_state(pipe).scales), sixbit.runtime.hooks.names(x)) == before


def test_changes_after_wrapping_are_refused_and_dropping_the_wrapper_stops_the_workers():
    """Issue 61: sixbit calls that change a model whose workers run it (a LoRA's scale, unloading or
    switching it off, the delta cache, offloading, a conversion…) were accepted and ignored by the
    workers; now each is refused, naming close(), before anything changes. ``del wrapper`` left the
    workers running (the model kept the wrapper); now garbage collection stops them."""
    pipe = load_pipeline("wan")
    sixbit.convert_model(pipe, None, "w8a8")
    name, layer = next((n, m) for n, m in pipe.transformer.named_modules() if isinstance(m, QuantLinear))
    sixbit.load_lora(pipe, {f"{name}.lora_A.weight": torch.randn(2, layer.in_features) / 8,
                            f"{name}.lora_B.weight": torch.randn(layer.out_features, 2) / 8})
    want = video(pipe, steps=1)
    wrapped = TensorParallelWrapper(pipe, device_ids=[0, 1])
    workers = pids_of(wrapped)
    refuse_changes(pipe, wrapped)
    with pytest.raises(ValueError, match=r"already wrapped by a TensorParallelWrapper: .*close\(\)"):
        TensorParallelWrapper(pipe, device_ids=[0, 1])
    del wrapped
    gc.collect()
    assert gone(workers)  # the model did not keep the wrapper, nor its workers
    assert sixbit.parallel.wrapper_of(pipe.transformer) is None
    assert np.array_equal(video(pipe, steps=1), want)  # it runs here again, unchanged


def test_a_cast_after_wrapping_is_refused_and_a_killed_worker_raises_worker_error(tmp_path):
    """Issue 61: ``.to(torch.bfloat16)`` on the caller after wrapping broke every call in the
    workers (a dtype mismatch there) and sixbit.save would have written a model they never ran; a
    killed worker gave a raw BrokenPipeError at the next request."""
    pipe = load_pipeline("wan")
    wrapped = TensorParallelWrapper(pipe, device_ids=[0, 1])
    workers = pids_of(wrapped)
    pipe.transformer.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"cannot call it: this model changed after it was wrapped \(the model was "
                                         r"cast: .* is torch\.bfloat16 here and torch\.float32 in the workers\).*"
                                         r"wrapper\.close\(\)"):
        video(wrapped, steps=1)
    with pytest.raises(ValueError, match=r"cannot save it: this model changed after it was wrapped \(the model was"):
        sixbit.save(wrapped, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists() and wrapped.driver.alive  # refused here: the workers run on
    os.kill(workers[1], signal.SIGKILL)
    wrapped.driver.processes[1].join(15)  # ended, and reaped (a killed worker's threads take a moment to end)
    with pytest.raises(driver.WorkerError, match=r"worker 1 \(pid \d+\) ended with exit code -9 before it was sent "
                                                 r"a run: every worker is stopped; call close\(\)"):
        wrapped.on_workers(lambda w: None)
    assert gone(workers)
    wrapped.close()


def test_the_record_of_the_handed_model_sees_casts_new_layers_and_edits_not_moves():
    """In one process: what a call or save after wrapping is checked against (driver.Driver.handed)."""
    pipe = load_pipeline("wan")
    x = pipe.transformer
    handed = handover.Handed.of(x)
    pipe.to("cpu")  # a move of the caller's copy: nothing the workers run changes
    assert handed.change(x) is None
    name, layer = next((n, m) for n, m in x.named_modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        layer.weight.add_(1)
    assert handed.change(x) == f"{name}.weight was changed in place"
    handed = handover.Handed.of(x)
    x.load_lora_adapter({f"{name}.lora_A.weight": torch.zeros(2, layer.in_features),  # diffusers' PEFT LoRA
                         f"{name}.lora_B.weight": torch.zeros(layer.out_features, 2)}, prefix=None)
    assert handed.change(x) == (f"module {name!r} was replaced (torch.nn.modules.linear.Linear → "
                                "peft.tuners.lora.layer.Linear)")
    handed = handover.Handed.of(x)
    x.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"cannot call it: this model changed after it was wrapped \(the model was "
                                         r"cast: \S+ is torch.bfloat16 here and torch.float32 in the workers\)"):
        handed.check(x, "call it")


def test_a_hook_that_cannot_be_pickled_is_named_before_any_worker_starts():
    """Issue 61: a forward hook holding a lock gave pickle's bare TypeError, naming no module."""
    pipe = load_pipeline("wan")
    lock = threading.Lock()

    def guarded(module, args):
        with lock:
            pass

    target = pipe.transformer.blocks[0].attn1
    target.register_forward_pre_hook(guarded)
    with pytest.raises(TypeError, match=r"the forward pre hook .*guarded \(closure variable 'lock'\) of module "
                                        r"'blocks\.0\.attn1' cannot be pickled \(TypeError: cannot pickle "
                                        r"'_thread\.lock' object\): remove it before wrapping"):
        TensorParallelWrapper(pipe, device_ids=[0, 1])
    assert not multiprocessing.active_children() and sixbit.parallel.wrapper_of(pipe.transformer) is None
