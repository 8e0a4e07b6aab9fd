"""`RawModule` of the stand-in: the kernels' real CUDA source, compiled as C++ and run on the host.

- The source goes through a C++ compiler with a small header that defines CUDA's built-ins (blockIdx,
  threadIdx, blockDim, gridDim, __syncthreads, __shared__, min/max, __longlong_as_double).
- A generated launcher per `extern "C" __global__` kernel runs every thread of every block in order.
  Kernels that call __syncthreads run each thread of a block as a fiber (ucontext) that yields at the
  barrier, so shared-memory reductions see the same values as on a GPU; threads that leave while others
  wait at a barrier (a divergent __syncthreads) are an error.
- Every launch is checked the way a GPU would refuse it or silently misread it: grid and block limits
  (gridDim.y and .z <= 65,535, at most 1,024 threads a block), and each argument against the kernel's C
  signature: pointers must be C-contiguous stand-in device arrays of the pointee type (a host array is a
  TypeError as in CuPy), scalars must be NumPy scalars of the exact C type (np.int32 for int, ...).
A launch goes to `stream=` (else this thread's current stream) through `graphs.launch`: run now, or recorded
by a capture of that stream with its arguments as they are (pointers and scalars baked, as in a graph).
Compiled libraries are cached on disk by source hash (shared with the test subprocesses).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

from . import counters, graphs
from .device_memory import DeviceArray

MAX_GRID = (2 ** 31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
LAUNCHES: list[tuple[str, tuple, tuple]] = []     # (kernel, grid, block) of every launch, for tests

_HEADER = r"""
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ucontext.h>
#include <vector>
struct standin_dim3 { unsigned int x, y, z; };
static standin_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __align__(n) alignas(n)
#define __shared__ static
using std::fmax; using std::fmin; using std::min; using std::max; using std::sqrt; using std::exp;
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
using std::fma;
// CUDA's round-to-nearest intrinsics: one rounding each (the host compiler contracts nothing at -O1 without
// -ffp-contract=fast on FMA hardware; -ffp-contract=off below makes sure)
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static ucontext_t standin_scheduler;
static ucontext_t* standin_current = nullptr;      // the running fiber (nullptr: no barrier in this kernel)
static inline void __syncthreads() { if (standin_current) swapcontext(standin_current, &standin_scheduler); }
"""

_RUNNER = r"""
struct StandinFiber { ucontext_t ctx; bool done; unsigned x, y, z; };
static std::vector<StandinFiber> standin_fibers;
static std::vector<std::vector<char>> standin_stacks;
template <class F> static F*& standin_body() { static F* body = nullptr; return body; }
template <class F> static void standin_entry(int i) {
    (*standin_body<F>())();
    standin_fibers[i].done = true;
}
// 0: ran; 1: divergent __syncthreads (some threads left while others waited at a barrier)
template <class F> static int standin_run(const unsigned* g, const unsigned* b, bool barriers, F& body) {
    gridDim = {g[0], g[1], g[2]};
    blockDim = {b[0], b[1], b[2]};
    unsigned nt = b[0] * b[1] * b[2];
    if (barriers) {
        standin_fibers.resize(nt);
        if (standin_stacks.size() < nt) standin_stacks.resize(nt, std::vector<char>(1 << 16));
        standin_body<F>() = &body;
    }
    for (unsigned bz = 0; bz < g[2]; ++bz) for (unsigned by = 0; by < g[1]; ++by)
    for (unsigned bx = 0; bx < g[0]; ++bx) {
        blockIdx = {bx, by, bz};
        if (!barriers) {
            for (unsigned tz = 0; tz < b[2]; ++tz) for (unsigned ty = 0; ty < b[1]; ++ty)
            for (unsigned tx = 0; tx < b[0]; ++tx) { threadIdx = {tx, ty, tz}; body(); }
            continue;
        }
        for (unsigned t = 0; t < nt; ++t) {
            StandinFiber& f = standin_fibers[t];
            f.done = false;
            f.x = t % b[0]; f.y = (t / b[0]) % b[1]; f.z = t / (b[0] * b[1]);
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = standin_stacks[t].data();
            f.ctx.uc_stack.ss_size = standin_stacks[t].size();
            f.ctx.uc_link = &standin_scheduler;
            makecontext(&f.ctx, (void (*)())standin_entry<F>, 1, (int)t);
        }
        for (;;) {
            unsigned waiting = 0, left = 0;
            for (unsigned t = 0; t < nt; ++t) {
                StandinFiber& f = standin_fibers[t];
                if (f.done) continue;
                threadIdx = {f.x, f.y, f.z};
                standin_current = &f.ctx;
                swapcontext(&standin_scheduler, &f.ctx);
                standin_current = nullptr;
                if (f.done) ++left; else ++waiting;
            }
            if (!waiting) break;
            if (left) return 1;
        }
    }
    return 0;
}
"""

_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)\s*\{', re.S)
_SCALARS = {"int": np.int32, "unsigned int": np.uint32, "long long": np.int64, "unsigned long long": np.uint64,
            "float": np.float32, "double": np.float64, "char": np.int8, "unsigned char": np.uint8,
            "bool": np.bool_, "size_t": np.uint64}
_CTYPES = {np.int32: ctypes.c_int32, np.uint32: ctypes.c_uint32, np.int64: ctypes.c_int64,
           np.uint64: ctypes.c_uint64, np.float32: ctypes.c_float, np.float64: ctypes.c_double,
           np.int8: ctypes.c_int8, np.uint8: ctypes.c_uint8, np.bool_: ctypes.c_bool}


def _cache_dir() -> str:
    d = os.environ.get("PYDTNN_STANDIN_CACHE") or os.path.join(tempfile.gettempdir(),
                                                                 f"pydtnn-gpu-standin-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def parse_kernels(code: str):
    """[(name, [(c type, parameter name)], body text)] of every extern "C" __global__ kernel."""
    typedefs = dict((alias, real.strip()) for real, alias in re.findall(r"typedef\s+([\w\s]+?)\s+(\w+)\s*;", code))
    kernels = []
    for m in _KERNEL_RE.finditer(code):
        params = []
        for p in (s.strip() for s in m.group(2).split(",")):
            if not p:
                continue
            pm = re.match(r"(.*?)(\w+)$", p, re.S)
            ctype, pname = " ".join(pm.group(1).split()), pm.group(2)
            params.append((ctype, pname))
        kernels.append((m.group(1), params, code[m.end():_closing_brace(code, m.end())]))
    return kernels, typedefs


def _closing_brace(code: str, start: int) -> int:
    """Index of the brace that closes the block opened just before `start`."""
    depth = 1
    for i in range(start, len(code)):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        if depth == 0:
            return i
    raise AssertionError("unbalanced braces in the kernel source")


def _resolve(ctype: str, typedefs):
    """('pointer' | 'scalar', numpy type) of a parameter's C type."""
    pointer = ctype.endswith("*")
    base = " ".join(w for w in ctype.rstrip("*").replace("*", " ").split() if w not in ("const", "__restrict__"))
    base = typedefs.get(base, base)
    if base not in _SCALARS:
        raise AssertionError(f"stand-in: unsupported kernel parameter type {ctype!r}")
    return ("pointer" if pointer else "scalar"), _SCALARS[base]


def _calls_barrier(body: str, code: str) -> bool:
    """Whether a kernel (or a device function it names) calls __syncthreads."""
    if "__syncthreads" in body:
        return True
    for fn in re.findall(r"(\w+)\s*(?:<[^<>]*>)?\s*\(", body):
        m = re.search(r"__device__[^{;]*?\b" + re.escape(fn) + r"\s*\([^)]*\)\s*\{", code)
        if m and "__syncthreads" in code[m.end():_closing_brace(code, m.end())]:
            return True
    return False


def _launcher(name, params, barriers):
    unpack = "".join(f"    {t} p{i} = *reinterpret_cast<{t}*>(a[{i}]);\n" for i, (t, _) in enumerate(params))
    call = ", ".join(f"p{i}" for i in range(len(params)))
    return (f'extern "C" int standin_launch_{name}(const unsigned* g, const unsigned* b, void** a) {{\n{unpack}'
            f"    auto body = [&]() {{ {name}({call}); }};\n"
            f"    return standin_run(g, b, {'true' if barriers else 'false'}, body);\n}}\n")


def compile_module(code: str):
    kernels, typedefs = parse_kernels(code)
    source = _HEADER + code + _RUNNER + "".join(_launcher(n, p, _calls_barrier(b, code)) for n, p, b in kernels)
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    lib_path = os.path.join(_cache_dir(), f"kernels-{digest}.so")
    if not os.path.exists(lib_path):
        cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
        if cxx is None:
            raise RuntimeError("the GPU stand-in needs a C++ compiler (c++, g++ or clang++) to run the CUDA kernels")
        src_path = lib_path[:-3] + f".{os.getpid()}.cpp"
        with open(src_path, "w") as f:
            f.write(source)
        tmp = lib_path + f".{os.getpid()}.tmp"
        r = subprocess.run([cxx, "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-w", "-o", tmp, src_path],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"the CUDA source does not compile as C++ on the host:\n{r.stderr[-4000:]}")
        os.replace(tmp, lib_path)                  # atomic: concurrent test processes never see half a file
        os.remove(src_path)
    lib = ctypes.CDLL(lib_path)
    return lib, {name: [(t, pn) + _resolve(t, typedefs) for t, pn in params] for name, params, _ in kernels}


def _dims(v, what):
    dims = tuple(int(d) for d in (v if isinstance(v, tuple) else (v,)))
    if not 1 <= len(dims) <= 3:
        raise AssertionError(f"{what} must have 1 to 3 dimensions, got {v!r}")
    return dims + (1,) * (3 - len(dims))


class RawFunction:
    def __init__(self, lib, name, params):
        self.name, self.params = name, params
        self._launch = getattr(lib, f"standin_launch_{name}")
        self._launch.restype = ctypes.c_int

    def _check_grid(self, grid, block):
        g, b = _dims(grid, f"{self.name}: grid"), _dims(block, f"{self.name}: block")
        for axis, (v, limit) in enumerate(zip(g, MAX_GRID)):
            if not 1 <= v <= limit:
                raise AssertionError(f"{self.name}: gridDim.{'xyz'[axis]} = {v} outside 1..{limit} (the launch fails)")
        for axis, (v, limit) in enumerate(zip(b, MAX_BLOCK)):
            if not 1 <= v <= limit:
                raise AssertionError(f"{self.name}: blockDim.{'xyz'[axis]} = {v} outside 1..{limit}")
        if b[0] * b[1] * b[2] > MAX_THREADS_PER_BLOCK:
            raise AssertionError(f"{self.name}: {b[0] * b[1] * b[2]} threads a block (at most 1024)")
        return g, b

    def _marshal(self, args):
        if len(args) != len(self.params):
            raise TypeError(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
        values = []
        for i, (arg, (ctype, pname, kind, nptype)) in enumerate(zip(args, self.params)):
            where = f"{self.name} argument {i} ({ctype} {pname})"
            if kind == "pointer":
                if isinstance(arg, np.ndarray):
                    raise TypeError(f"{where}: a host numpy.ndarray (CuPy refuses it: Unsupported type)")
                if not isinstance(arg, DeviceArray):
                    raise TypeError(f"{where}: expected a device array, got {type(arg).__name__}")
                if arg.dtype != np.dtype(nptype):
                    raise TypeError(f"{where}: device array of {arg.dtype}, the kernel reads {np.dtype(nptype)}")
                if not arg.flags.c_contiguous:
                    raise TypeError(f"{where}: not C-contiguous (the kernel would read the wrong elements)")
                values.append(ctypes.c_void_p(arg.data.ptr))
            else:
                if type(arg) is not nptype:
                    raise TypeError(f"{where}: expected numpy.{nptype.__name__}, got {type(arg).__name__} "
                                    f"{arg!r} (pass the exact C type)")
                values.append(_CTYPES[nptype](arg))
        return values

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        g, b = self._check_grid(grid, block)
        args = tuple(args)
        values = self._marshal(args)
        LAUNCHES.append((self.name, g, b))
        graphs.launch("launch", self.name, lambda: self._run(args, values, g, b), stream)

    def _run(self, args, values, g, b):
        if not counters.SETTINGS["execute"]:      # dry: outputs (non-const pointers) zeroed, nothing computed
            for arg, (ctype, _pname, kind, _t) in zip(args, self.params):
                if kind == "pointer" and not ctype.strip().startswith("const"):
                    arg._a[...] = 0
            return
        arg_ptrs = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        gd, bd = (ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b)
        if self._launch(gd, bd, arg_ptrs) != 0:
            raise AssertionError(f"{self.name}: divergent __syncthreads (threads left while others waited)")


class RawModule:
    """`cupy.RawModule(code=...)`; `get_function(name)` returns a checked launcher."""

    def __init__(self, code: str = None, path: str = None, options=(), backend="nvrtc", **kwargs):
        if code is None:
            raise AssertionError("the stand-in's RawModule compiles source code only (code=...)")
        self.code = code
        self._lib, self._params = compile_module(code)

    def get_function(self, name: str) -> RawFunction:
        if name not in self._params:
            raise AttributeError(f"no kernel {name!r} in the module (CUDA_ERROR_NOT_FOUND)")
        return RawFunction(self._lib, name, self._params[name])
