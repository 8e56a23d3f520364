"""Compiled CPU kernels: C sources in `csrc/`, built on first use and loaded with ctypes.

The fused attention kernel (`csrc/attention.c`, `csrc/attention_amx.c`), QK-norm + RoPE
(`csrc/norm_rope.c`), RMS norm and the gated residual (`csrc/norms.c`), the head's loss
(`csrc/head.c`) and SiLU ⊙ up (`csrc/swiglu.c`) are
plain C with GCC vector extensions and OpenMP: they include only the C library, so the
library builds with the system C compiler in about a second (`cc -O3 -march=native
-fopenmp`), without PyTorch's headers, ninja or a Python build step, and a missing
compiler costs speed, never correctness (the model falls back to its PyTorch kernels).
The build is cached per source, compiler, flags, CPU and the instruction set the flags
target (`isa`), so it happens once per machine, and a cache shared with another CPU never
hands this one a library it cannot run:

    $SANLAB_KERNEL_CACHE, else $XDG_CACHE_HOME/sanlab/kernels, else ~/.cache/sanlab/kernels
    (a temporary directory if none of these can be written)

The interface is `csrc/sanlab.h`: each entry point takes one struct, mirrored here by a
`ctypes.Structure` whose fields are set by name (`AttnArgs`, …). A loaded library must
report the header's `SANLAB_ABI_VERSION` and its struct sizes (`abi_mismatch`); a cached
build that does not is compiled again, and one that still does not is
`NativeUnavailable` (one line), never a call with the wrong layout.

The library is compiled with `-fopenmp` and loaded after torch, so its OpenMP calls
resolve to the runtime torch already loaded (one thread pool, `torch.get_num_threads()`
threads). `SANLAB_NATIVE=0` turns the compiled kernels off; `CC` picks the compiler.

Nothing is built or loaded at import: `library()` does it on the first call.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Iterator

CSRC = Path(__file__).parent / "csrc"
HEADER = CSRC / "sanlab.h"  # the interface: the entry points' structs and SANLAB_ABI_VERSION


def _header_abi_version() -> int:
    """SANLAB_ABI_VERSION as csrc/sanlab.h defines it (its one definition)."""
    m = re.search(r"^#define SANLAB_ABI_VERSION (\d+)\s*$", HEADER.read_text(), re.M)
    if m is None:
        raise RuntimeError(f"{HEADER} defines no SANLAB_ABI_VERSION")
    return int(m.group(1))


# What a build must report (`sanlab_abi_version()`); another value means a stale or foreign build.
ABI_VERSION = _header_abi_version()


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.c"))


# --------------------------------------------------------------------------- the interface
# ctypes mirrors of csrc/sanlab.h's structs, field for field (tests/test_native.py checks
# them against the header; `load` checks their sizes against the library's).
_I32, _I64, _F32, _P = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class Tensor(ctypes.Structure):
    """`sanlab_tensor`: a strided operand, element (b, h, t, d) at data + b·sb + h·sh + t·st + d."""

    _fields_ = [("data", _P), ("bf16", _I32), ("sb", _I64), ("sh", _I64), ("st", _I64)]


class AttnArgs(ctypes.Structure):
    """`sanlab_attn_args`: the fused attention's forward and backward."""

    _fields_ = [("B", _I32), ("H", _I32), ("Hkv", _I32), ("T", _I32), ("D", _I32),
                ("q", Tensor), ("k", Tensor), ("v", Tensor), ("dout", Tensor), ("start", _P),
                ("gq", _P), ("gk", _P), ("eps", _F32), ("cos", _P), ("sin", _P), ("csb", _I64), ("cst", _I64),
                ("rq", _P), ("rk", _P), ("dgq", _P), ("dgk", _P), ("out", _P), ("lse", _P),
                ("y", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor), ("nthreads", _I32), ("mode", _I32),
                ("gain_batches", _I32)]


class NormRoPEArgs(ctypes.Structure):
    """`sanlab_norm_rope_args`: the per-head QK-norm then RoPE, forward and backward."""

    _fields_ = [("B", _I32), ("T", _I32), ("h", _I32), ("D", _I32), ("x", Tensor), ("gain", _P), ("eps", _F32),
                ("cos", _P), ("sin", _P), ("csb", _I64), ("cst", _I64), ("r", _P), ("out", _P), ("dy", Tensor),
                ("dx", Tensor), ("dgain", _P), ("nthreads", _I32)]


class RMSNormArgs(ctypes.Structure):
    """`sanlab_rms_norm_args`: RMS norm over rows, forward and backward."""

    _fields_ = [("n", _I64), ("d", _I32), ("x", _P), ("gain", _P), ("eps", _F32), ("r", _P), ("out", _P),
                ("out_bf16", _I32), ("dy", _P), ("dy_bf16", _I32), ("dx", _P), ("dgain", _P), ("nthreads", _I32),
                ("group_rows", _I64)]


class GatedResidualArgs(ctypes.Structure):
    """`sanlab_gated_residual_args`: the gated residual, forward and backward."""

    _fields_ = [("count", _I64), ("d", _I32), ("dy", _P), ("h", _P), ("h_bf16", _I32), ("sigma", _F32), ("dh", _P),
                ("dg", _P), ("nthreads", _I32), ("group_count", _I64), ("sigmas", _P), ("x", _P), ("out", _P)]


class HeadCEArgs(ctypes.Structure):
    """`sanlab_head_ce_args`: the head's cross-entropy and z-loss over a chunk of logits."""

    _fields_ = [("n", _I64), ("V", _I32), ("logits", _P), ("logits_bf16", _I32), ("ld", _I64), ("targets", _P),
                ("weights", _P), ("c", _F32), ("lse", _P), ("x_t", _P), ("grad", _P), ("grad_bf16", _I32),
                ("ld_grad", _I64), ("nthreads", _I32)]


class SiLUGateArgs(ctypes.Structure):
    """`sanlab_silu_gate_args`: SiLU(gate) ⊙ up from the fused [gate | up] product, forward and backward."""

    _fields_ = [("rows", _I64), ("F", _I32), ("gate_up", _P), ("bf16", _I32), ("y", _P), ("dy", _P), ("grad", _P),
                ("nthreads", _I32), ("vec_cols", _I32)]


# in the order of `sanlab_abi_sizes`
STRUCTS: tuple[type[ctypes.Structure], ...] = (Tensor, AttnArgs, NormRoPEArgs, RMSNormArgs, GatedResidualArgs,
                                               HeadCEArgs, SiLUGateArgs)
# entry point -> the struct it takes
ENTRY_POINTS: dict[str, type[ctypes.Structure]] = {
    "sanlab_attn_fwd": AttnArgs, "sanlab_attn_bwd": AttnArgs,
    "sanlab_norm_rope_fwd": NormRoPEArgs, "sanlab_norm_rope_bwd": NormRoPEArgs,
    "sanlab_rms_norm_fwd": RMSNormArgs, "sanlab_rms_norm_bwd": RMSNormArgs,
    "sanlab_gated_residual_fwd": GatedResidualArgs, "sanlab_gated_residual_bwd": GatedResidualArgs,
    "sanlab_head_ce": HeadCEArgs,
    "sanlab_silu_gate_fwd": SiLUGateArgs, "sanlab_silu_gate_bwd": SiLUGateArgs,
}


def tensor(x, sb: int, sh: int, st: int, offset: int = 0) -> Tensor:  # noqa: ANN001 - a torch.Tensor
    """A `sanlab_tensor` for x (fp32 or bf16, its last dim contiguous): element (b, h, t, d)
    at x.data_ptr() + (offset + b·sb + h·sh + t·st + d) elements."""
    import torch

    return Tensor(x.data_ptr() + offset * x.element_size(), int(x.dtype == torch.bfloat16), sb, sh, st)

# Tried in order until one compiles: native vectors with OpenMP, then without (macOS's
# clang has no -fopenmp: one thread), then portable code.
FLAG_SETS: tuple[tuple[str, ...], ...] = (
    ("-march=native", "-fopenmp"),
    ("-mcpu=native", "-fopenmp"),
    ("-march=native",),
    ("-mcpu=native",),
    (),
)
BASE_FLAGS = ("-O3", "-std=gnu11", "-shared", "-fPIC")


class NativeUnavailable(RuntimeError):
    """The compiled kernels cannot be used here; the message says why, in one line."""


class ABIMismatch(NativeUnavailable):
    """A library whose interface is not csrc/sanlab.h's as `sanlab.model.native` mirrors it."""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None


def cache_dir() -> Path:
    env = os.environ.get("SANLAB_KERNEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sanlab" / "kernels"


def compiler() -> str | None:
    """The C compiler: $CC, else cc, gcc or clang on the PATH."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    for name in ("cc", "gcc", "clang"):
        if path := shutil.which(name):
            return path
    return None


def isa(cc: str, flags: tuple[str, ...]) -> str:
    """The instruction set a build with `flags` targets (what -march=native turns on): the
    compiler's predefined ISA macros (__AVX512F__, __AMX_BF16__, __ARM_NEON, …), or "" if
    the compiler cannot say. Part of the build's cache key, so a library built for another
    CPU is never loaded here."""
    try:
        proc = subprocess.run([cc, *flags, "-E", "-dM", "-x", "c", os.devnull], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    isa_macro = r"^#define (__(?:SSE|AVX|AMX|FMA|F16C|BMI|ARM_NEON|ARM_FEATURE_|aarch64|x86_64)\w*)"
    names = re.findall(isa_macro, proc.stdout, re.M)
    return " ".join(sorted(set(names)))


def _cpu_signature() -> str:
    """What -march=native depends on: the machine and, on Linux, the CPU's feature flags."""
    sig = platform.machine() + platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return sig + line
    except OSError:
        pass
    return sig


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=d, prefix=".probe-", delete=True)
        probe.close()
        return True
    except OSError:
        return False


def compile_library(cc: str, flags: tuple[str, ...], target: Path) -> str | None:
    """Compile the kernels with `flags` (besides BASE_FLAGS) into `target`, atomically (a
    temporary name in its folder, then a rename, so concurrent builds cannot tear it).
    Returns None, or the compiler's first error line."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".sanlab-kernels-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run([cc, *BASE_FLAGS, *flags, "-o", tmp, *map(str, sources()), "-lm"],
                              capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        Path(tmp).unlink(missing_ok=True)
        return str(e)
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        return next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
    os.replace(tmp, target)
    return None


def _candidates(cc: str) -> Iterator[tuple[Path, tuple[str, ...]]]:
    """Where each flag set's build of these sources by `cc` lives in the cache, in the order
    they are tried: keyed by the sources, the compiler and its version, the flags, the CPU
    and the instruction set the flags target (`isa`)."""
    source = b"\0".join(f.name.encode() + b"\0" + f.read_bytes() for f in [*sources(), *sorted(CSRC.glob("*.h"))])
    version = _compiler_version(cc)
    d = cache_dir()
    if not _writable(d):
        d = Path(tempfile.gettempdir()) / f"sanlab-kernels-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
        d.mkdir(parents=True, exist_ok=True)
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([source, cc.encode(), version.encode(), " ".join(BASE_FLAGS + flags).encode(),
                                          _cpu_signature().encode(), isa(cc, flags).encode()])).hexdigest()[:16]
        yield d / f"sanlab-kernels-{key}.so", flags


def _build(cc: str) -> tuple[Path, tuple[str, ...]]:
    """The library for these sources, compiler and CPU: from the cache, or compiled into it
    with the first flag set that compiles. Returns its path and its flags."""
    errors = []
    for target, flags in _candidates(cc):
        if target.exists():
            return target, flags
        error = compile_library(cc, flags, target)
        if error is None:
            return target, flags
        errors.append(f"{' '.join(flags) or 'no flags'}: {error}")
    raise NativeUnavailable(f"{cc} could not build the kernels in {CSRC} ({'; '.join(errors)})")


def _build_and_load(cc: str) -> ctypes.CDLL:
    """`load(_build(cc))`; a cached library that does not load or does not match the
    interface (a stale or damaged file under a current key) is compiled again, once,
    and replaces it. The fresh build is loaded under its own name first: a process
    cannot load a second library from a path it already loaded."""
    path, flags = _build(cc)
    try:
        return load(path)
    except (ABIMismatch, OSError):
        fresh = path.with_name(f"{path.stem}-rebuild-{os.getpid()}.so")
        error = compile_library(cc, flags, fresh)
        if error is not None:
            raise NativeUnavailable(f"{cc} could not rebuild the kernels in {CSRC}: {error}") from None
        try:
            lib = load(fresh)  # (raises again if the sources themselves disagree with this module)
        except BaseException:
            fresh.unlink(missing_ok=True)
            raise
        os.replace(fresh, path)
        return lib


def abi_mismatch(lib: ctypes.CDLL) -> str | None:
    """Why `lib` does not have the interface of csrc/sanlab.h as this module mirrors it
    (another ABI version, other struct sizes, a missing function), or None. Calls
    nothing but the two identity functions, so a foreign or stale build cannot crash it."""
    try:
        version, sizes_fn = lib.sanlab_abi_version, lib.sanlab_abi_sizes
    except AttributeError:
        return "not a build of this interface (no sanlab_abi_version/sanlab_abi_sizes)"
    version.argtypes, version.restype = [], ctypes.c_int
    sizes_fn.argtypes, sizes_fn.restype = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int], ctypes.c_int
    got = version()
    if got != ABI_VERSION:
        return f"ABI {got}, expected {ABI_VERSION}"
    sizes = (ctypes.c_int64 * len(STRUCTS))()
    n = sizes_fn(sizes, len(STRUCTS))
    want = [ctypes.sizeof(s) for s in STRUCTS]
    if n != len(STRUCTS) or list(sizes) != want:
        return f"struct sizes {list(sizes)[:n]}, expected {want} (ABI {ABI_VERSION})"
    missing = [name for name in [*ENTRY_POINTS, "sanlab_amx_available"] if not hasattr(lib, name)]
    if missing:
        return f"no {', '.join(missing)}"
    return None


def load(path: Path) -> ctypes.CDLL:
    """A built library, its interface checked (`abi_mismatch`: NativeUnavailable, one line)
    and its functions declared."""
    import torch  # noqa: F401 - loaded first, so the library's OpenMP is torch's runtime

    lib = ctypes.CDLL(str(path))
    why = abi_mismatch(lib)
    if why is not None:
        raise ABIMismatch(f"the kernels at {path} do not match csrc/sanlab.h: {why}")
    _declare(lib)
    lib.sanlab_amx_available()  # settles (and requests) the AMX tile state on this thread, once
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    lib.sanlab_amx_available.argtypes, lib.sanlab_amx_available.restype = [], ctypes.c_int
    for name, struct in ENTRY_POINTS.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.POINTER(struct)], ctypes.c_int


def library() -> ctypes.CDLL:
    """The compiled kernels, built on the first call (cached on disk and in the process).
    Raises `NativeUnavailable` with the reason if they cannot be used here."""
    global _lib, _error
    if _lib is not None:  # (every norm and attention call asks: no lock once loaded)
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        if _error is not None:
            raise NativeUnavailable(_error)
        try:
            if os.environ.get("SANLAB_NATIVE", "1") == "0":
                raise NativeUnavailable("turned off by SANLAB_NATIVE=0")
            cc = compiler()
            if cc is None:
                raise NativeUnavailable(f"CC={os.environ['CC']} is not a program on the PATH" if os.environ.get("CC")
                                        else "no C compiler found (set CC, or install gcc or clang)")
            lib = _build_and_load(cc)
        except NativeUnavailable as e:
            _error = str(e)
            raise
        except OSError as e:
            _error = f"could not build or load the kernels in {CSRC}: {e}"
            raise NativeUnavailable(_error) from e
        _lib = lib
        return lib


def identity() -> str:
    """The compiled kernels here, for keys of cached measurements (a study's speed.json):
    a hash of their sources and whether the attention's products run on AMX, or
    "unavailable". Builds the library if it is not built yet."""
    try:
        lib = library()
    except NativeUnavailable:
        return "unavailable"
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(CSRC.glob("*.[ch]")))).hexdigest()[:12]
    return f"{digest}-{'amx' if lib.sanlab_amx_available() else 'portable'}"


def available() -> bool:
    try:
        library()
        return True
    except NativeUnavailable:
        return False


def ready(x) -> bool:  # noqa: ANN001 - a torch.Tensor (torch is not imported here at import)
    """Whether the compiled kernels may run on x: a CPU tensor, eager mode (inductor
    compiles the plain formulas instead), and the library built here."""
    import torch

    return x.device.type == "cpu" and not torch.compiler.is_compiling() and available()


def call(fn, args: ctypes.Structure) -> None:  # noqa: ANN001
    """`fn(&args)` for a kernel entry point, its status turned into an exception: 2 is
    MemoryError (a buffer could not be allocated), any other non-zero a RuntimeError."""
    status = fn(ctypes.byref(args))
    if status == 2:
        raise MemoryError(f"{fn.__name__}: out of memory for its buffers")
    if status != 0:
        raise RuntimeError(f"{fn.__name__}: the kernel refused its arguments (status {status})")


def unavailable_reason() -> str | None:
    try:
        library()
        return None
    except NativeUnavailable as e:
        return str(e)
