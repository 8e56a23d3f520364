"""Compiled CPU kernels: C sources in `csrc/`, built on first use and loaded with ctypes.

The fused attention kernel (`csrc/attention.c`, `csrc/attention_amx.c`), QK-norm + RoPE
(`csrc/norm_rope.c`), RMS norm and the gated residual's backward (`csrc/norms.c`) are plain C with GCC vector extensions and OpenMP: they include
only the C library, so the library builds with the system C compiler in about a second
(`cc -O3 -march=native -fopenmp`), without PyTorch's headers, ninja or a Python build
step, and a missing compiler costs speed, never correctness (`sanlab.model.kernels`
falls back to its PyTorch kernels). The build is cached per source, compiler, flags
and CPU, so it happens once per machine:

    $SANLAB_KERNEL_CACHE, else $XDG_CACHE_HOME/sanlab/kernels, else ~/.cache/sanlab/kernels
    (a temporary directory if none of these can be written)

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
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
ABI_VERSION = 2  # sanlab_abi_version() of csrc/library.c; a mismatch means a stale build


def sources() -> list[Path]:
    return sorted(CSRC.glob("*.c"))

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


def _build(cc: str) -> Path:
    """The library for this source, compiler and CPU: from the cache, or compiled into it."""
    source = b"\0".join(f.name.encode() + b"\0" + f.read_bytes() for f in [*sources(), *sorted(CSRC.glob("*.h"))])
    version = _compiler_version(cc)
    d = cache_dir()
    if not _writable(d):
        d = Path(tempfile.gettempdir()) / f"sanlab-kernels-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
        d.mkdir(parents=True, exist_ok=True)
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([source, cc.encode(), version.encode(), " ".join(BASE_FLAGS + flags).encode(),
                                          _cpu_signature().encode()])).hexdigest()[:16]
        target = d / f"sanlab-kernels-{key}.so"
        if target.exists():
            return target
        error = compile_library(cc, flags, target)
        if error is None:
            return target
        errors.append(f"{' '.join(flags) or 'no flags'}: {error}")
    raise NativeUnavailable(f"{cc} could not build the kernels in {CSRC} ({'; '.join(errors)})")


def load(path: Path) -> ctypes.CDLL:
    """A built library, its functions declared (the ABI checked)."""
    import torch  # noqa: F401 - loaded first, so the library's OpenMP is torch's runtime

    lib = ctypes.CDLL(str(path))
    _declare(lib)
    if lib.sanlab_abi_version() != ABI_VERSION:
        raise NativeUnavailable(f"the built kernels report ABI {lib.sanlab_abi_version()}, expected {ABI_VERSION}")
    lib.sanlab_amx_available()  # settles (and requests) the AMX tile state on this thread, once
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    I, L, P, F = ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_float
    tensor = [P, I, L, L, L]  # data, is_bf16, three strides in elements (the last dim contiguous)
    lib.sanlab_abi_version.argtypes, lib.sanlab_abi_version.restype = [], I
    lib.sanlab_amx_available.argtypes, lib.sanlab_amx_available.restype = [], I
    norm = [P, P, F, P, P, L, L]  # QK-norm: gains q, k, eps, cos, sin, their strides of b and t (NULLs: none)
    lib.sanlab_attn_fwd.argtypes = [I] * 5 + tensor * 3 + [P] + norm + [P, P, P, P] + tensor + [I, I]
    lib.sanlab_attn_fwd.restype = I
    lib.sanlab_attn_bwd.argtypes = [I] * 5 + tensor * 4 + [P] + norm + [P, P, P, P, P, P] + tensor * 3 + [I, I]
    lib.sanlab_attn_bwd.restype = I
    tables = [P, P, L, L]  # cos, sin, strides of b and t
    lib.sanlab_norm_rope_fwd.argtypes = [I] * 4 + tensor + [P, F] + tables + [P, P, I]
    lib.sanlab_norm_rope_fwd.restype = I
    lib.sanlab_norm_rope_bwd.argtypes = [I] * 4 + tensor + [P, P] + tables + [P, L, L, L, P, I, P, I]
    lib.sanlab_norm_rope_bwd.restype = I
    lib.sanlab_rms_norm_fwd.argtypes = [L, I, P, P, F, P, I, P, I]
    lib.sanlab_rms_norm_fwd.restype = I
    lib.sanlab_rms_norm_bwd.argtypes = [L, I, P, P, P, P, I, P, P, I]
    lib.sanlab_rms_norm_bwd.restype = I
    lib.sanlab_gated_residual_bwd.argtypes = [L, I, P, P, I, F, P, P, I]
    lib.sanlab_gated_residual_bwd.restype = I


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
            lib = load(_build(cc))
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


def call(fn, *args) -> None:  # noqa: ANN001
    """`fn(*args)` for a kernel entry point, its status turned into an exception: 2 is
    MemoryError (a buffer could not be allocated), any other non-zero a RuntimeError."""
    status = fn(*args)
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
