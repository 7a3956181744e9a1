"""One line naming the machine a measurement ran on (CPU model and kind, threads, CPU capability, GPU)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from ..kernels import cpu_kind


def machine_description() -> str:
    """One line describing the machine the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    desc = (
        f"{cpu} [{cpu_kind()}], {os.cpu_count()} logical CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads, CPU capability {torch.backends.cpu.get_cpu_capability()})"
    )
    if torch.cuda.is_available():
        desc += f", GPU {torch.cuda.get_device_name()}"
    return desc
