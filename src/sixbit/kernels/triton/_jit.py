"""The Triton kernels themselves (``@triton.jit``), imported only when a kernel is first called;
their wrappers, reference twins and docs are in :mod:`.quantize`, :mod:`.gemm` and :mod:`.attention`."""

import triton
import triton.language as tl


@triton.jit
def rotated(x, h, h_scale, SIGNS: tl.constexpr):
    """``x`` (a tile) times ``h``, in fp32 (see :func:`int8_rows`)."""
    if SIGNS:
        y = tl.dot(x, h, out_dtype=tl.float32) * h_scale
    else:
        y = tl.dot(x.to(tl.float32), h, input_precision="ieee")
    return y


@triton.jit
def int8_rows(x_ptr, h_ptr, q_ptr, s_ptr, M, K, h_scale, ROWS: tl.constexpr, BLOCK: tl.constexpr,
              ROTATE: tl.constexpr, SIGNS: tl.constexpr):
    """Per-token INT8 codes of ``x`` rotated by the Hadamard block ``h``. ``SIGNS``: ``h`` holds
    ±1 in ``x``'s 16-bit dtype, multiplied on tensor cores with fp32 sums (every product exact),
    then scaled by ``h_scale``; else ``h`` is the normalized fp32 matrix, multiplied in fp32."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    row_ok = rows[:, None] < M
    if ROTATE:
        h = tl.load(h_ptr + cols[:, None] * BLOCK + cols[None, :])
    amax = tl.zeros((ROWS,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        ok = row_ok & (k0 + cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * K + k0 + cols[None, :], mask=ok, other=0.0)
        if ROTATE:
            x = rotated(x, h, h_scale, SIGNS)
        else:
            x = x.to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    scale = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, 127.0))
    tl.store(s_ptr + rows, scale, mask=rows < M)
    for k0 in range(0, K, BLOCK):
        ok = row_ok & (k0 + cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * K + k0 + cols[None, :], mask=ok, other=0.0)
        if ROTATE:
            x = rotated(x, h, h_scale, SIGNS)
        else:
            x = x.to(tl.float32)
        y = tl.math.div_rn(x, scale[:, None])
        y = (y + 12582912.0) - 12582912.0  # 1.5·2^23: rounds |y| < 2^22 to nearest even
        y = tl.minimum(tl.maximum(y, -127.0), 127.0)
        tl.store(q_ptr + rows[:, None] * K + k0 + cols[None, :], y.to(tl.int8), mask=ok)


@triton.jit
def e4m3(bits):
    """fp32 value of E4M3 bit patterns (uint8): decoded arithmetically, so no FP8 hardware is needed."""
    b = bits.to(tl.int32)
    e = (b >> 3) & 15
    m = (b & 7).to(tl.float32)
    v = tl.where(e == 0, m * 0.001953125, (8.0 + m) * tl.exp2((e - 10).to(tl.float32)))
    return tl.where((b & 128) != 0, -v, v)


@triton.jit
def nibbles(byte, SIGNED_INT: tl.constexpr):
    """fp32 values of 4-bit codes: E2M1 (NVFP4) or two's-complement INT4."""
    c = byte.to(tl.int32) & 15
    if SIGNED_INT:
        return tl.where(c >= 8, c - 16, c).to(tl.float32)
    mag = c & 7
    e = mag >> 1
    half = (mag & 1).to(tl.float32) * 0.5
    v = tl.where(e == 0, half, (1.0 + half) * tl.exp2((e - 1).to(tl.float32)))
    return tl.where(c >= 8, -v, v)


@triton.jit
def weight4(x_ptr, c_ptr, s_ptr, g_ptr, y_ptr, M, N, K, G, TM: tl.constexpr, TN: tl.constexpr,
            TK: tl.constexpr, GROUP: tl.constexpr, NVFP4: tl.constexpr):
    rm = tl.program_id(0) * TM + tl.arange(0, TM)
    rn = tl.program_id(1) * TN + tl.arange(0, TN)
    half = tl.arange(0, TK // 2)
    ks = tl.arange(0, TK)
    acc = tl.zeros((TM, TN), dtype=tl.float32)
    gscale = tl.load(g_ptr)
    for k0 in range(0, K, TK):
        x = tl.load(x_ptr + rm[:, None] * K + k0 + ks[None, :], mask=rm[:, None] < M, other=0.0)
        byte = tl.load(c_ptr + rn[:, None] * (K // 2) + k0 // 2 + half[None, :], mask=rn[:, None] < N, other=0)
        lo = nibbles(byte, not NVFP4)
        hi = nibbles(byte >> 4, not NVFP4)
        w = tl.reshape(tl.join(lo, hi), (TN, TK))  # element 2i in the low nibble
        if GROUP >= TK:
            sidx = (k0 // GROUP) + tl.zeros((1,), dtype=tl.int32)
            s = tl.load(s_ptr + rn[:, None] * G + sidx[None, :], mask=rn[:, None] < N, other=0)
        else:
            sidx = k0 // GROUP + tl.arange(0, TK) // GROUP
            s = tl.load(s_ptr + rn[:, None] * G + sidx[None, :], mask=rn[:, None] < N, other=0)
        if NVFP4:
            s = e4m3(s) * gscale
        w = (w * s).to(x.dtype)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def epilogue(a_ptr, xs_ptr, ws_ptr, b_ptr, y_ptr, M, N, TM: tl.constexpr, TN: tl.constexpr, BIAS: tl.constexpr):
    rm = tl.program_id(0) * TM + tl.arange(0, TM)
    rn = tl.program_id(1) * TN + tl.arange(0, TN)
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    acc = tl.load(a_ptr + rm[:, None] * N + rn[None, :], mask=ok, other=0).to(tl.float32)
    y = acc * tl.load(xs_ptr + rm, mask=rm < M, other=0.0)[:, None] * tl.load(ws_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if BIAS:
        y += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def pow2(e):
    """fp32 ``2^e`` of int32 exponents in [−126, 127], from its bits (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def mx_round(p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
             EMAX: tl.constexpr, PMAX: tl.constexpr):
    """``p ≥ 0 (BLOCK_M, BLOCK_N)`` rounded per block of 32 columns as
    :func:`sixbit.formats.mx.round_blocks` does: an E8M0 exponent ``floor(log2 amax) − EMAX``
    (−127 for a zero block), then each value divided by it, saturated at ``PMAX`` and rounded to
    nearest even on the element's grid (``MBITS`` mantissa bits, subnormals below ``2^EMIN``).
    Returns the grid values (before the scale) and the E8M0 codes ``(BLOCK_M, BLOCK_N / 32)``."""
    blocks = tl.reshape(p, (BLOCK_M, BLOCK_N // 32, 32))
    amax = tl.max(blocks, axis=2)
    e = ((amax.to(tl.int32, bitcast=True) >> 23) & 255) - 127  # floor(log2 amax) of a normal amax
    exp = tl.where(amax > 0, tl.maximum(e - EMAX, -127), -127)
    x = tl.minimum(blocks * pow2(-exp)[:, :, None], PMAX)  # a power of two: exact
    binade = tl.maximum(((x.to(tl.int32, bitcast=True) >> 23) & 255) - 127, EMIN)
    quanta = x * pow2(MBITS - binade)
    quanta = (quanta + 12582912.0) - 12582912.0  # 1.5·2^23: rounds to nearest even
    return tl.reshape(quanta * pow2(binade - MBITS), (BLOCK_M, BLOCK_N)), (exp + 127).to(tl.uint8)


@triton.jit
def int8_attention(q_ptr, k_ptr, v_ptr, qs_ptr, ks_ptr, o_ptr, LQ, LK, D, DV, QBLOCKS, KBLOCKS, sm_scale,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
                   P_MX: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                   PMAX: tl.constexpr):
    """One (query block, batch·head): INT8 codes ``q (BH, LQ, D)``, ``k (BH, LK, D)``, one fp32
    scale per block of ``BLOCK_M`` query / ``BLOCK_N`` key tokens; ``v (BH, LK, DV)`` in any float
    dtype, rounded to FP16 here; ``o (BH, LQ, DV)``. ``P_MX``: each tile's probabilities rounded to
    a 6-bit float (``MBITS``, ``EMIN``, ``EMAX``, ``PMAX`` of E2M3 or E3M2) with an E8M0 scale per 32
    keys (:func:`mx_round`), multiplied by ``tl.dot_scaled``; else P in FP16."""
    qb = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rm = qb * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    d = tl.arange(0, DP)
    dv = tl.arange(0, DVP)
    q = tl.load(q_ptr + bh * LQ * D + rm[:, None] * D + d[None, :], mask=(rm[:, None] < LQ) & (d[None, :] < D), other=0)
    q_scale = tl.load(qs_ptr + bh * QBLOCKS + qb) * sm_scale
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, DVP), dtype=tl.float32)
    for kb in range(0, KBLOCKS):
        cols = kb * BLOCK_N + rn
        k = tl.load(k_ptr + bh * LK * D + cols[:, None] * D + d[None, :], mask=(cols[:, None] < LK) & (d[None, :] < D),
                    other=0)
        # the integer product is exact (int32); rescaled in the reference's order: (qk · (s_q·s)) · s_k
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * q_scale * tl.load(ks_ptr + bh * KBLOCKS + kb)
        s = tl.where(cols[None, :] < LK, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + bh * LK * DV + cols[:, None] * DV + dv[None, :],
                    mask=(cols[:, None] < LK) & (dv[None, :] < DV), other=0.0).to(tl.float16)
        if P_MX:  # 6-bit values, exact in E4M3 (this Triton's dot_scaled has no e2m3/e3m2 operand)
            values, scales = mx_round(p, BLOCK_M, BLOCK_N, MBITS, EMIN, EMAX, PMAX)
            acc = acc * alpha[:, None] + tl.dot_scaled(values.to(tl.float8e4nv), scales, "e4m3", v, None, "fp16")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v, out_dtype=tl.float32)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + bh * LQ * DV + rm[:, None] * DV + dv[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(rm[:, None] < LQ) & (dv[None, :] < DV))
