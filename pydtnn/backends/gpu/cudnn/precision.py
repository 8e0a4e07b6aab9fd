"""What each float32 precision allows cuDNN to do, in one place (float64 always computes in double).

- "tf32": any plan; TF32 tensor cores allowed (cuDNN's and cuBLAS's default on Ampere and later).
- "fp32": float32 arithmetic, no TF32, any algorithm (FFT and Winograd included): what PyTorch runs with
  `torch.backends.cudnn.allow_tf32 = False` and `torch.backends.cuda.matmul.allow_tf32 = False`.
- "fp32_strict": float32 arithmetic with no TF32, FFT or Winograd in any engine: GEMM-like algorithms only,
  whose error stays near float32 rounding (FFT and Winograd plans can exceed 1e-5 relative). It runs on the
  legacy API, whose algorithms are named by enum: the frontend's engines are known only by their numerical
  notes, and a Winograd wgrad engine ran on the H200 although every Winograd note was deselected.
"""
from __future__ import annotations

PRECISIONS = ("fp32", "tf32", "fp32_strict")
DEFAULT = "fp32"

# frontend numerical notes that mean tensor-core (TF32) arithmetic or a lower-precision reduction
NO_TF32_NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION")

# FFT, FFT_TILING, WINOGRAD, WINOGRAD_NONFUSED of cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t (cudnn_cnn.h)
LEGACY_FFT_WINOGRAD = {"fprop": {4, 5, 6, 7}, "dgrad": {2, 3, 4, 5}, "wgrad": {2, 4, 5, 6}}


def check(precision: str) -> str:
    from pydtnn.errors import ConfigError
    if precision not in PRECISIONS:
        raise ConfigError(f"GPU precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def no_tf32(precision: str, float32: bool) -> bool:
    return float32 and precision in ("fp32", "fp32_strict")


def strict(precision: str, float32: bool) -> bool:
    return float32 and precision == "fp32_strict"
