# A user's plain script, run by test_driver.py: no launcher, no process group, and (on purpose)
# no `if __name__ == "__main__":` guard, as the seed's call is written. It prints one JSON line
# per event: the worker pids, then what happened.
#
#   python driver_script.py error      # a worker raises mid-generation; then a second wrapper, left open at exit
#   python driver_script.py interrupt  # a long generation, interrupted by the test with SIGINT
import json
import os
import sys

import torch

from sixbit.parallel import TensorParallelWrapper
from sixbit.zoo.shapes import load_pipeline


def say(**event):
    print(json.dumps(event), flush=True)


def pids(wrapper):
    return wrapper.on_workers(lambda w: os.getpid())


def boom(module, args, kwargs):  # in the workers: rank 1 fails at the third call
    module.calls = getattr(module, "calls", 0) + 1
    if module.calls == 3 and torch.distributed.is_initialized() and torch.distributed.get_rank() == 1:
        raise ValueError("injected failure in rank 1")


case = sys.argv[1]
pipe = load_pipeline("wan")
if case == "error":
    pipe.transformer.register_forward_pre_hook(boom, with_kwargs=True)
    wrapped = TensorParallelWrapper(pipe, device_ids=[0, 1], chunk_size=32)
    say(pids=pids(wrapped))
    try:
        wrapped(["a red circle moving right"], num_inference_steps=6, generator=[torch.Generator().manual_seed(0)])
        say(raised=None)
    except ValueError as e:
        say(raised=type(e).__name__, message=str(e), cause=str(e.__cause__))
    try:
        wrapped(["a red circle moving right"], num_inference_steps=2)
    except RuntimeError as e:
        say(after=str(e))
    wrapped.close()
    second = TensorParallelWrapper(load_pipeline("wan"), device_ids=["cpu", "cpu"])
    say(pids=pids(second))  # left running: interpreter exit stops it
else:
    wrapped = TensorParallelWrapper(pipe, device_ids=[0, 1])
    say(pids=pids(wrapped))
    say(generating=True)
    wrapped(["a red circle moving right"], num_inference_steps=100000)
