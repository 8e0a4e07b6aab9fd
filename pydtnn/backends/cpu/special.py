"""Special functions of the CPU backend, compiled with numba (GELU's Phi); `SpecialKernels`, at the end, is
the host side of `erfc`.

- `erfc`: float64 (and any dtype), one loop calling the C library's erfc, parallel over parts (`runtime.threads`).
  libm calls do not vectorize (about 7 ns an element).
- `ndtr32`: float32 GELU's Phi(x) from arithmetic alone (no libm call), so the loops
  that call it vectorize: float64 inside, erfc(a) = exp(-a^2) t P(t) with t = 1 / (1 + 0.47 a), P a degree-10
  polynomial fitted (weighted least squares on Chebyshev nodes, Lawson reweighting) to erfc(a) exp(a^2) / t
  on 0 <= a <= 10.6 (|x| <= 15; beyond, Phi rounds to 0 or 1 in float32): relative error <= 8.4e-10 there,
  checked on 200,001 points against libm. exp(-u) by u = k ln 2 - r, |r| <= ln2 / 2, a degree-13 Taylor
  polynomial (remainder <= 0.35^14 / 14! < 1e-17) and 2^-k built in the exponent bits. u = x^2 / 2 is exact
  in float64 for a float32 x. So Phi carries <= 1e-9 relative error before its one rounding to float32.
  Measured over EVERY finite float32 input (`scripts/experiments/gelu_error_bound.py`, against libm in float64): Phi
  within 0.514 ulp; y = x Phi within 1.510 ulp where Phi is normal (two roundings) and 7.5 ulps of 2^-149
  where Phi is subnormal (x < -13.1: Phi's absolute rounding times |x|); the derivative Phi + x phi (the
  forward keeps it for the backward) within 1.004 eps32 (Phi + |x phi|). NaN gives NaN; Phi(+-inf) = 1, 0.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pydtnn.backends.cpu.jit import IEEE
from pydtnn.backends.cpu.parts import part_range
from pydtnn.backends.cpu.runtime.threads import POOL


@njit(**IEEE)
def erfc(t, nt, x, out, n):
    i0, i1 = part_range(t, nt, n)
    for i in range(i0, i1):
        out[i] = math.erfc(x[i])


@intrinsic
def _f64_bits(typingctx, x):
    """The IEEE bits of a float64 as an int64 (no conversion)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(x), codegen


@intrinsic
def _bits_f64(typingctx, b):
    """The float64 whose IEEE bits are the int64 b."""
    if b != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(b), codegen


# Strict IEEE arithmetic (no fast math): the rounding trick below must not be reassociated away. NumPy's
# error model: a float division without Python's zero check (whose branch kept the loops scalar).
_NJ_EXACT = {"cache": True, "boundscheck": False, "nogil": True, "fastmath": {"contract"}, "error_model": "numpy"}

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_ROUND = 6755399441055744.0          # 1.5 * 2^52: v + _ROUND rounds v to an integer held in the low bits
_RSQRT2 = 0.7071067811865476
_U_MAX = 112.5                       # x^2 / 2 at |x| = 15: Phi(-15) ~ 4e-51 rounds to 0 in float32
_A_MAX = 10.6                        # |x| / sqrt 2 at 15 (the fit's end)
_P = 0.47
# P(t), highest power first (the fit described above)
_C = (0.03687072200426905, -0.2303483364015483, 0.5821763480109988, -0.7195079486577473, 0.4183250979416208,
      -0.17944115044384695, 0.15888489571563985, 0.16541857686567096, 0.23739031913820752, 0.2650588578891995,
      0.2651726187745335)


@njit(**_NJ_EXACT)
def exp_neg(u):
    """exp(-u) for 0 <= u <= 708 (NaN stays NaN), float64: relative error ~ (u + 1) eps64 (the rounding of
    k ln 2 - u; ln 2 itself is off by 2^-54 relative), accurate enough for float64 attention weights."""
    v = u * _LOG2E
    kd = v + _ROUND
    kbits = _f64_bits(kd)                # low bits: k = round(u log2 e)
    k = kd - _ROUND
    r = k * _LN2 - u                     # exp(-u) = 2^-k exp(r), |r| <= ln2 / 2
    p = 1.0 / 6227020800.0               # Taylor to r^13 / 13!: remainder <= 0.35^14 / 14! < 1e-17
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    scale = _bits_f64((1023 - kbits) << 52)     # 2^-k: only the low 12 bits of (1023 - kbits) survive the shift
    return p * scale


@intrinsic
def _pow2_neg32(typingctx, kd):
    """2^-k as a float32, for kd = 1.5 * 2^23 + k (0 <= k <= 126 held in kd's low mantissa bits): the bits
    (127 - bits(kd)) << 23, in 32-bit integers (only the low 9 bits of 127 - bits(kd) survive the shift),
    so that a float32 loop around it vectorizes 8 wide."""
    if kd != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        e = builder.shl(builder.sub(ir.Constant(i32, 127), bits), ir.Constant(i32, 23))
        return builder.bitcast(e, ir.FloatType())

    return types.float32(kd), codegen


_F32 = types.float32
_LOG2E_32 = _F32(1.4426950408889634)
_ROUND_32 = _F32(12582912.0)                # 1.5 * 2^23: v + _ROUND_32 rounds v to an integer in the low bits
_LN2_HI_32 = _F32(0.693145751953125)        # ln 2 in 15 bits: k * _LN2_HI_32 is exact for k < 2^9
_LN2_LO_32 = _F32(1.4286068203094173e-06)   # ln 2 - _LN2_HI_32
EXP32_UNDERFLOW = 87.0                      # exp(-87) = 1.6e-38, still normal; beyond, callers use 0


@njit(**_NJ_EXACT)
def exp_neg32(u):
    """exp(-u) in float32 for a float32 0 <= u <= EXP32_UNDERFLOW (NaN stays NaN), arithmetic only so that
    loops calling it vectorize 8 wide. u = k ln 2 - r with ln 2 split in two (Cody-Waite: k ln2_hi - u is
    exact, |r| <= ln2 / 2 carries one rounding), Taylor to r^7 (remainder <= 0.35^8 / 8! < 6e-9 relative,
    below eps32 / 8), 2^-k in the exponent bits: a few float32 ulps, against the float32 rounding of the
    result that float64 arithmetic would have."""
    kd = u * _LOG2E_32 + _ROUND_32        # low bits: k = round(u log2 e)
    k = kd - _ROUND_32
    r = (k * _LN2_HI_32 - u) + k * _LN2_LO_32
    p = _F32(1.0 / 5040.0)
    p = p * r + _F32(1.0 / 720.0)
    p = p * r + _F32(1.0 / 120.0)
    p = p * r + _F32(1.0 / 24.0)
    p = p * r + _F32(1.0 / 6.0)
    p = p * r + _F32(0.5)
    p = p * r + _F32(1.0)
    p = p * r + _F32(1.0)
    return p * _pow2_neg32(kd)


@njit(**_NJ_EXACT)
def ndtr32_parts(x):
    """(Phi(x), exp(-x^2 / 2)) in float64 for a float32 x (see the module's error bound); the exponential is
    0 beyond |x| = 15, where x phi(x) rounds to 0 in float32 (NaN: Phi NaN, the exponential 0)."""
    xd = float(x)
    u = 0.5 * xd * xd
    uc = u if u <= _U_MAX else _U_MAX
    a = abs(xd) * _RSQRT2
    if a > _A_MAX:
        a = _A_MAX
    t = 1.0 / (1.0 + _P * a)
    p = _C[0]
    p = p * t + _C[1]
    p = p * t + _C[2]
    p = p * t + _C[3]
    p = p * t + _C[4]
    p = p * t + _C[5]
    p = p * t + _C[6]
    p = p * t + _C[7]
    p = p * t + _C[8]
    p = p * t + _C[9]
    p = p * t + _C[10]
    g = exp_neg(uc)
    half_erfc = 0.5 * g * t * p          # Phi(-|x|)
    return (half_erfc if xd < 0.0 else 1.0 - half_erfc), (g if u <= _U_MAX else 0.0)


@njit(**_NJ_EXACT)
def ndtr32(x):
    """Phi(x) in float64 for a float32 x (see the module's error bound)."""
    return ndtr32_parts(x)[0]


class SpecialKernels:
    """The host side of `erfc`, mixed into `CPUBackend`."""

    def erfc(self, x):
        x = self._c(x)
        out = np.empty_like(x)
        POOL.run(erfc, self._nt(x.size), x.reshape(-1), out.reshape(-1), x.size)
        return out
