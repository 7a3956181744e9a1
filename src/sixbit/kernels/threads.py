"""Torch's CPU ops on one thread for a stretch of many small, synchronized steps: :func:`one_thread`.

A second OpenMP thread speeds up large GEMMs, but a loop of small ops (GPTQ's column-by-column
updates) or LAPACK's many level-2 steps (``eigh``, the QR inside ``svd_lowrank``) pays a barrier
per step, and each barrier waits for a thread the OS may have descheduled: on a 2-core AMD EPYC
(MKL) with other processes running, ``eigh`` at 1536² took 0.4 s on one thread and 4–22 s on
two, ``svd_lowrank`` of 8960 × 1536 0.18 s against 1.35 s, and GPTQ of an 8960 × 1536 weight
1.3 s against 6–24 s. The results are the same to fp32 rounding.

Example:
    >>> import torch
    >>> with one_thread(torch.device("cpu")):
    ...     torch.get_num_threads()
    1
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Inside: torch's CPU ops on one thread when ``device`` is the CPU (other devices, or a
    process already on one thread, as they are); the thread count is restored on exit."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


__all__ = ["one_thread"]
