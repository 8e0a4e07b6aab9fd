"""Kernel calls as C function pointers, for the thread pool's GIL-free workers (`threads`).

`native_job(fn, args, block)` packs fn's native entry point and args (C-contiguous arrays, ints, bools,
floats) into the int64 array `block`, and returns the address of a `cfunc`
`int64 job(int64 t, int64 nt, int64 *block)` that unpacks them and calls fn(t, nt, *args) through numba's
own calling convention: 0 on success, 1 if the kernel raised. None where fn is not a numba kernel or an
argument cannot travel as int64 words: the pool then runs fn the Python way.

- `_pack` (one numba specialization per argument types, cached on disk) writes the words and returns a
  hash of the argument types, so that a call costs one dispatch (~1-3 us) and a dict lookup.
- A job depends on the argument types only, not on the kernel (whose address travels in block[0]), and
  does not link the kernel in (linking recompiled it: 6-9 s per convolution). It is generated code, written
  to a file under `$PYDTNN_CACHE` (else ~/.cache/pydtnn) so that numba caches its compilation (~0.4 s for a
  convolution's 24 arguments), in a folder named after this file's and numba's versions.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
import zlib

import numba
from numba import literal_unroll, njit, typeof, types
from numba.core import errors
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic, overload
from numba.np.numpy_support import as_dtype

BLOCK_WORDS = 512

_jobs: dict = {}          # (kernel, types hash) -> (job address, kernel address), or None: the Python way
_wrappers: dict = {}      # argument types -> cfunc


# --- packing: one numba call per kernel launch ---------------------------------------------------------
@intrinsic
def _float_bits(typingctx, x):
    """The float x as float64, its bits as an int64."""
    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[0], signature.args[0], types.float64)
        return builder.bitcast(v, context.get_value_type(types.int64))

    return types.int64(x), codegen


@njit(inline="always")
def _set(block, pos, value):
    block[pos] = value
    return pos + 1


def _put(block, pos, a):
    """Write a's words at block[pos:]; the next position (numba only)."""


@overload(_put)
def _put_impl(block, pos, a):
    if isinstance(a, types.Array):
        nd = a.ndim

        def put_array(block, pos, a):
            block[pos] = a.ctypes.data
            for d in range(nd):
                block[pos + 1 + d] = a.shape[d]
            return pos + 1 + nd
        return put_array
    if isinstance(a, types.Boolean):
        return lambda block, pos, a: _set(block, pos, 1 if a else 0)
    if isinstance(a, types.Integer):
        return lambda block, pos, a: _set(block, pos, a)
    if isinstance(a, types.Float):
        return lambda block, pos, a: _set(block, pos, _float_bits(a))
    return None


def _carried(t) -> bool:
    return ((isinstance(t, types.Array) and t.layout == "C" and isinstance(t.dtype, (types.Number, types.Boolean)))
            or isinstance(t, (types.Boolean, types.Integer, types.Float)))


def _words(ts) -> int:
    return 1 + sum(1 + t.ndim if isinstance(t, types.Array) else 1 for t in ts)


def _types_hash(ts) -> int:
    """A hash of the argument types (mutability aside: a job passes writable arrays); -1 if not carried."""
    if not all(_carried(t) for t in ts):
        return -1
    return zlib.crc32(str(tuple(_writable(t) for t in ts)).encode())


def _writable(t):
    return types.Array(t.dtype, t.ndim, "C") if isinstance(t, types.Array) else t


def _signature(args):
    """(types hash, words) of args (numba only)."""


@overload(_signature)
def _signature_impl(args):
    h, w = _types_hash(args.types), _words(args.types)
    return lambda args: (h, w)


@njit(nogil=True, cache=True)
def _pack(block, *args):
    h, w = _signature(args)
    if h < 0 or w > block.size:
        return -1
    pos = 1                                   # block[0]: the kernel's address
    for a in literal_unroll(args):
        pos = _put(block, pos, a)
    return h


# --- the job: unpack and call --------------------------------------------------------------------------
@intrinsic
def _call_native(typingctx, address, argtuple):
    """Call the numba-compiled function at `address` with the tuple's items as arguments (numba's calling
    convention, result None); 1 if it raised, else 0."""
    argtys = tuple(argtuple.types)

    def codegen(context, builder, signature, args):
        fnty = context.call_conv.get_function_type(types.none, argtys)
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        values = [builder.extract_value(args[1], i) for i in range(len(argtys))]
        status, _ = context.call_conv.call_function(builder, fn, types.none, argtys, values)
        return builder.zext(status.is_error, context.get_value_type(types.int64))

    return types.int64(address, argtuple), codegen


@intrinsic
def _as_pointer(typingctx, address, dtype):
    """The int64 `address` as a pointer to `dtype` elements (a NumPy scalar class, e.g. np.float32)."""
    if not isinstance(dtype, types.NumberClass):
        return None
    elem = dtype.instance_type

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(elem).as_pointer())

    return types.CPointer(elem)(address, dtype), codegen


@intrinsic
def _bits_as_float(typingctx, bits):
    """The int64 `bits` read as a float64."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(bits), codegen


def _source(ts) -> str:
    """The module source of the job for argument types ts."""
    exprs, w = [], 1
    for t in ts:
        if isinstance(t, types.Array):
            shape = "".join(f"b[{w + 1 + d}], " for d in range(t.ndim))
            exprs.append(f"carray(_as_pointer(b[{w}], np.{as_dtype(t.dtype).name}), ({shape}))")
            w += 1 + t.ndim
        elif isinstance(t, types.Boolean):
            exprs.append(f"b[{w}] != 0")
            w += 1
        elif isinstance(t, types.Integer):
            exprs.append(f"np.{as_dtype(t).name}(b[{w}])")
            w += 1
        else:
            exprs.append(f"np.{as_dtype(t).name}(_bits_as_float(b[{w}]))")
            w += 1
    return (f"# generated by pydtnn.backends.cpu.runtime.jobs for the argument types {ts}\n"
            f"import numpy as np\n"
            f"from numba import carray, cfunc\n"
            f"from pydtnn.backends.cpu.runtime.jobs import JOB_SIGNATURE, _as_pointer, _bits_as_float, _call_native\n\n\n"
            f"@cfunc(JOB_SIGNATURE, cache=CACHE)\n"
            f"def job(t, nt, p):\n"
            f"    b = carray(p, ({w},))\n"
            f"    return _call_native(b[0], (t, nt, {''.join(e + ', ' for e in exprs)}))\n")


JOB_SIGNATURE = types.int64(types.int64, types.int64, types.CPointer(types.int64))


@functools.lru_cache(maxsize=None)
def _cache_dir() -> str | None:
    """Where generated jobs are written (their numba cache beside them), one folder per version of this
    file and of numba; None if it cannot be written. Found once per process."""
    here = open(__file__, "rb").read()
    tag = f"{zlib.crc32(here):08x}-numba{numba.__version__}"
    base = os.environ.get("PYDTNN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pydtnn")
    path = os.path.join(base, "cpu-jobs", tag)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    return path if os.access(path, os.W_OK) else None


def _load(ts):
    """The job cfunc for ts: from a generated file (numba caches it on disk), else compiled in memory."""
    src = _source(ts)
    folder = _cache_dir()
    if folder is not None:
        path = os.path.join(folder, f"job_{zlib.crc32(src.encode()):08x}.py")
        try:
            if not os.path.exists(path):
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(src.replace("cache=CACHE", "cache=True"))
                os.replace(tmp, path)              # atomic: ranks on one node may race here
            spec = importlib.util.spec_from_file_location(f"pydtnn_cpu_job_{os.path.basename(path)[4:-3]}", path)
            module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module.job
        except OSError:
            pass
    scope: dict = {}
    exec(compile(src.replace("cache=CACHE", "cache=False"), "<pydtnn cpu job>", "exec"), scope)
    return scope["job"]


def _wrapper(ts):
    job = _wrappers.get(ts)
    if job is None:
        job = _wrappers[ts] = _load(ts)
    return job


def _kernel_address(fn, ts) -> int:
    sig = (types.int64, types.int64) + ts
    fn.compile(sig)
    cres = fn.overloads[sig]
    if cres.signature.return_type != types.none:
        raise TypeError(f"kernel {fn.__name__} returns {cres.signature.return_type}, a pool job returns nothing")
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)


def _make(fn, args, h):
    ts = tuple(_writable(typeof(a)) for a in args)
    if _types_hash(ts) != h:           # a type that numba reads differently here than in a call
        return None
    try:
        return _wrapper(ts).address, _kernel_address(fn, ts)
    except Exception as e:  # noqa: BLE001 -- the Python way still runs the kernel, only slower
        warnings.warn(f"pydtnn cpu backend: no GIL-free job for {fn.__name__} ({type(e).__name__}: {e}); its "
                      "worker threads take the GIL", RuntimeWarning, stacklevel=4)
        return None


def native_job(fn, args, block) -> int | None:
    """Pack fn and args into `block` and return the job's address, or None (see the module's docstring)."""
    if not isinstance(fn, CPUDispatcher):
        return None
    try:
        h = _pack(block, *args)
    except errors.TypingError:       # an argument type no job carries
        return None
    if h < 0:
        return None
    key = (fn, h)
    entry = _jobs.get(key, False)
    if entry is False:
        entry = _jobs[key] = _make(fn, args, h)
    if entry is None:
        return None
    block[0] = entry[1]
    return entry[0]
