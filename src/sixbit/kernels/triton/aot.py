"""Ahead-of-time compilation of sixbit's Triton kernels for NVIDIA GPUs, on a machine without one.

``triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32))``
runs Triton's whole NVIDIA pipeline — TTIR, TTGIR, LLVM, PTX, and ``ptxas`` to a cubin — for
any target, no driver needed. :func:`variants` lists every configuration the wrappers
(:mod:`.quantize`, :mod:`.gemm`, :mod:`.attention`) launch for given layer widths and head dims,
from the same constant functions they launch with; :func:`compile_variant` compiles one for one
target and records what a GPU would meet:

* whether it compiles (else the reason: the compiler's message line);
* its shared memory against the target's per-block limit
  (:data:`sixbit.kernels.gpu_targets.SMEM_LIMIT`);
* registers and spilled bytes (``ptxas -v``, the same ``ptxas`` Triton launches with);
* the tensor-core instructions in its PTX (``mma.sync``, ``wgmma``, ``tcgen05.mma``) against what
  it multiplies: INT8 and 16-bit ``tl.dot`` should land on tensor cores; an fp32 ``tl.dot`` with
  ``input_precision="ieee"`` (the Hadamard rotation and W4A16 on fp32 inputs) runs on CUDA cores by design;
  on 16-bit inputs the rotation multiplies on tensor cores (:func:`~.quantize.signs_rotation`).

Pointers are compiled 16-byte aligned, as torch allocates them; integer arguments unspecialized
(at run time Triton also specializes the ones divisible by 16, which can only vectorize more).
Triton is imported on first use. A process that imported Triton under ``TRITON_INTERPRET=1``
(the test suite) has its standard library interpreted and cannot compile: :func:`compile_many`
compiles in fresh worker processes without it, in parallel.

Example:
    >>> v = [v for v in variants(ks=(1920,), head_dims=(64,)) if v.kernel == "int8_attention"][0]
    >>> v.row, v.config
    ('int8_attention', 'bf16, head dim 64, P fp16')
    >>> compile_variant(v, 90).ok                     # doctest: +SKIP
    True
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import logging
import multiprocessing
import os
import re

import torch

from ...transforms.hadamard import BLOCK_SIZES
from ..gpu_targets import SMEM_LIMIT, int8_rows_row
from .attention import attention_constants
from .availability import interpreted, jit
from .gemm import epilogue_constants, weight4_constants
from .quantize import int8_rows_constants, signs_rotation

DTYPES = ("bf16", "fp16", "fp32")  # the activation dtypes a model runs in
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
INT4_GROUPS = (16, 32, 64, 128, 256)  # int4-g16 … int4-g256, every group the W4A16 kernel reads
P_FORMATS = ("fp16", "e2m3", "e3m2")  # P formats the attention kernel takes
TENSOR_CORES, CUDA_CORES = "tensor cores", "fp32 on CUDA cores"

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Variant:
    """One configuration of one kernel: ``kernel`` (its ``@triton.jit`` name), ``config`` (in
    words), the runtime arguments' types, the compile-time constants, warps, and what its
    ``tl.dot`` should run on (``TENSOR_CORES``, ``CUDA_CORES``, or ``""``: it does not multiply)."""

    kernel: str
    config: str
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[str, object], ...]
    num_warps: int = 4
    multiplies: str = ""

    @property
    def row(self) -> str:
        """The :data:`sixbit.kernels.gpu_targets.TABLE` row deciding where this variant runs."""
        constants = dict(self.constants)
        if self.kernel == "int8_rows":
            return int8_rows_row(constants["BLOCK"] if constants["ROTATE"] else None)
        return "int8_attention_p6" if constants.get("P_MX") else self.kernel


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What compiling ``variant`` for ``target`` (e.g. 90) gave."""

    variant: Variant
    target: int
    compiles: bool
    error: str = ""
    shared: int = 0
    registers: int | None = None
    spills: int | None = None  # spill stores + loads, bytes
    mma: tuple[str, ...] = ()  # tensor-core instruction kinds in the PTX

    @property
    def fits(self) -> bool:
        return self.compiles and self.shared <= SMEM_LIMIT[self.target]

    @property
    def tensor_cores(self) -> bool:
        return bool(self.mma)

    @property
    def ok(self) -> bool:
        """Compiles, fits, and multiplies on tensor cores where it should."""
        return self.fits and (self.variant.multiplies != TENSOR_CORES or self.tensor_cores)

    def record(self) -> dict:
        v = self.variant
        return {"kernel": v.kernel, "row": v.row, "config": v.config, "target": f"sm_{self.target}",
                "compiles": self.compiles, "error": self.error, "shared": self.shared,
                "smem_limit": SMEM_LIMIT[self.target], "fits": self.fits, "registers": self.registers,
                "spills": self.spills, "multiplies": v.multiplies, "mma": list(self.mma), "ok": self.ok}


def _variant(kernel: str, config: str, signature: dict, constants: dict, warps: int = 4, multiplies: str = "") -> Variant:
    return Variant(kernel, config, tuple(signature.items()), tuple(constants.items()), warps, multiplies)


def _int8_rows(dtype: str, ks) -> list[Variant]:
    torch_dtype = _TORCH_DTYPES[dtype]
    signs = signs_rotation(torch_dtype)
    signature = {"x_ptr": f"*{dtype}", "h_ptr": f"*{dtype if signs else 'fp32'}", "q_ptr": "*i8", "s_ptr": "*fp32",
                 "M": "i32", "K": "i32", "h_scale": "fp32"}
    plain = {tuple(int8_rows_constants(k, None, torch_dtype).items()) for k in ks}
    rotations = sorted({b for b in BLOCK_SIZES for k in ks if k % b == 0})
    out = [_variant("int8_rows", f"{dtype}, no rotation, BLOCK {dict(c)['BLOCK']}", signature, dict(c))
           for c in sorted(plain)]
    return out + [_variant("int8_rows", f"{dtype}, Hadamard {b}", signature, int8_rows_constants(b, b, torch_dtype), 4,
                           TENSOR_CORES if signs else CUDA_CORES) for b in rotations]


def _weight4(dtype: str, ks) -> list[Variant]:
    base = {"x_ptr": f"*{dtype}", "c_ptr": "*u8", "g_ptr": "*fp32", "y_ptr": f"*{dtype}",
            "M": "i32", "N": "i32", "K": "i32", "G": "i32"}
    multiplies = CUDA_CORES if dtype == "fp32" else TENSOR_CORES
    groups = [("NVFP4", 16, True)] + [(f"INT4 group {g}", g, False) for g in INT4_GROUPS]
    groups += [(f"INT4 per channel, K {k}", k, False) for k in sorted(set(ks))]
    return [_variant("weight4", f"{dtype}, {name}", {**base, "s_ptr": "*u8" if nvfp4 else "*fp32"},
                     weight4_constants(group, nvfp4), 4, multiplies) for name, group, nvfp4 in groups]


def _epilogue(dtype: str) -> list[Variant]:
    signature = {"a_ptr": "*i32", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "b_ptr": "*fp32", "y_ptr": f"*{dtype}",
                 "M": "i32", "N": "i32"}
    return [_variant("epilogue", f"{dtype}, {'bias' if bias else 'no bias'}", signature, epilogue_constants(bias))
            for bias in (False, True)]


def _attention(dtype: str, head_dims) -> list[Variant]:
    signature = {"q_ptr": "*i8", "k_ptr": "*i8", "v_ptr": f"*{dtype}", "qs_ptr": "*fp32", "ks_ptr": "*fp32",
                 "o_ptr": f"*{dtype}", "LQ": "i32", "LK": "i32", "D": "i32", "DV": "i32", "QBLOCKS": "i32",
                 "KBLOCKS": "i32", "sm_scale": "fp32"}
    out = []
    for d in sorted(set(head_dims)):
        for p in P_FORMATS:
            constants, warps = attention_constants(d, d, p_format=p)
            out.append(_variant("int8_attention", f"{dtype}, head dim {d}, P {p}", signature, constants, warps,
                                TENSOR_CORES))
    return out


def variants(ks, head_dims, dtypes=DTYPES) -> list[Variant]:
    """Every kernel configuration the wrappers launch for linears of input widths ``ks`` and
    attention of head dims ``head_dims`` (query/key/value alike), at each activation dtype."""
    out = []
    for dtype in dtypes:
        out += _int8_rows(dtype, ks) + _weight4(dtype, ks) + _epilogue(dtype) + _attention(dtype, head_dims)
    return out


_MMA = re.compile(r"\b(mma\.sync|wgmma\.mma_async|tcgen05\.mma)\.[\w:.]*")
_FAMILY = {"mma.sync": "mma.sync", "wgmma.mma_async": "wgmma", "tcgen05.mma": "tcgen05"}
_TYPES = ("s8", "i8", "f16", "bf16", "tf32", "e4m3", "e5m2", "f8f6f4")


def tensor_core_kinds(ptx: str) -> tuple[str, ...]:
    """The tensor-core instructions in ``ptx``, as ``"family operand-type"``: ``("mma.sync s8", …)``."""
    kinds = set()
    for match in _MMA.finditer(ptx):
        fields = set(re.split(r"[.:]+", match.group(0)))
        family = _FAMILY[match.group(1)]
        kinds |= {f"{family} {t}" for t in _TYPES if t in fields} or {family}
    return tuple(sorted(kinds))


def _ptxas_numbers(log: str) -> tuple[int | None, int | None]:
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (int(regs.group(1)) if regs else None,
            int(spills.group(1)) + int(spills.group(2)) if spills else None)


def _reason(error: Exception) -> str:
    """The line of a compiler error that says why: a ``CompilationError`` ends with it (it starts
    with the source location and the code), other errors start with it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return lines[-1] if type(error).__name__ == "CompilationError" else lines[0]


def compile_variant(variant: Variant, target: int) -> Compiled:
    """Compile ``variant`` for ``target`` (compute capability × 10 + minor, e.g. 86); never raises
    for a kernel that does not compile: that is the record. Needs a process that has not imported
    Triton under ``TRITON_INTERPRET=1`` (else :func:`compile_many`)."""
    if interpreted():
        raise RuntimeError("Triton runs interpreted in this process (TRITON_INTERPRET=1) and cannot compile for a GPU: "
                           "use compile_many, which compiles in fresh processes")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(jit(), variant.kernel)
    constants = dict(variant.constants)
    signature = {**dict(variant.signature), **{name: "constexpr" for name in constants}}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, kind in variant.signature
             if kind.startswith("*")}
    log = io.StringIO()
    with triton.knobs.compilation.scope(), triton.knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        triton.knobs.compilation.always_compile = True  # ptxas runs, so its register report is there to read
        triton.knobs.nvidia.dump_ptxas_log = True
        try:
            kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=GPUTarget("cuda", target, 32),
                                    options={"num_warps": variant.num_warps, "enable_fp_fusion": True})
        except Exception as error:  # noqa: BLE001 - the compiler's own errors (CompilationError, ptxas) are the result
            return Compiled(variant, target, False, _reason(error))
    registers, spills = _ptxas_numbers(log.getvalue())
    return Compiled(variant, target, True, "", kernel.metadata.shared, registers, spills,
                    tensor_core_kinds(kernel.asm["ptx"]))


def _compile_job(job: tuple[Variant, int]) -> Compiled:
    return compile_variant(*job)


def compile_many(jobs, workers: int = 2, timeout: float | None = None) -> list[Compiled]:
    """:func:`compile_variant` of each ``(variant, target)`` in ``jobs``, in order, in ``workers``
    fresh processes started without ``TRITON_INTERPRET`` (so this works from a process that
    interprets its kernels); ``timeout`` seconds for all of them (``TimeoutError`` past it)."""
    jobs = list(jobs)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: Triton imported anew, compiled
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        interpret = os.environ.pop("TRITON_INTERPRET", None)
        try:  # every worker starts here, while the variable is unset (they inherit the environment)
            futures = [pool.submit(_compile_job, job) for job in jobs]
        finally:
            if interpret is not None:
                os.environ["TRITON_INTERPRET"] = interpret
        try:
            for count, _ in enumerate(concurrent.futures.as_completed(futures, timeout=timeout), 1):
                if count % 50 == 0:
                    logger.info("compiled %d of %d", count, len(jobs))
        except TimeoutError:
            for future in futures:
                future.cancel()
            raise TimeoutError(f"compilations still running after {timeout} s") from None
        return [future.result() for future in futures]
