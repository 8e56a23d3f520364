"""Host-side settings and facts for training on the CPU.

The allocator:

glibc's malloc serves every allocation above its mmap threshold (128 KiB, adapting up
to 32 MiB) with a fresh `mmap` and gives it back to the kernel on free, and trims the
heap top above its trim threshold. A CPU training step allocates and frees the same
activation-sized buffers (hundreds of KiB to tens of MiB) every step, so each step
re-faults and re-zeroes tens of MiB of pages: ~20,000 minor page faults and ~35 ms of
kernel time a step for the benchmark's d=256 model on a 2-core machine, about 15% of
the step (benchmarks/bench_train.py). Keeping freed memory in the process heap, as
the caching allocators PyTorch's CPU performance guide recommends (jemalloc,
tcmalloc) do, removes almost all of it. The cost is that the process keeps its peak
heap until it exits, which a training process reaches in its first steps anyway.

`SANLAB_MALLOC_TUNING=0` turns this off.

bf16: whether the CPU has bf16 dot-product instructions (`cpu_has_native_bf16`), which
decides what `auto` precision means (`train.precision`, `optim.ns_precision`).

CUDA: whether torch sees a GPU (`cuda_available`), asked without importing torch where no
GPU driver is there to see.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from pathlib import Path

# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Allocations up to this size come from the heap and are reused; larger ones (rare
# on the CPU) still get their own mapping. Older glibc refuses thresholds above
# HEAP_MAX_SIZE / 2 = 32 MiB; the fallback is that cap.
MMAP_THRESHOLD = 256 << 20
MMAP_THRESHOLD_FALLBACK = 32 << 20
TRIM_THRESHOLD = 1 << 30

_applied: bool | None = None


def tune_cpu_allocator() -> bool:
    """Keep freed memory in the heap (glibc on Linux). Idempotent; returns whether the
    settings are in force (False off glibc, or when `SANLAB_MALLOC_TUNING=0`)."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("SANLAB_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap_ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) or mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_FALLBACK)
    _applied = bool(mmap_ok) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


@functools.cache
def cpu_has_native_bf16() -> bool:
    """bf16 autocast pays off on CPUs with bf16 dot-product instructions (AVX512-BF16, AMX).

    Measured on such a CPU (2 cores, AVX512-BF16) with the default model (d=128, 4 layers,
    T=256, 16 rows): bf16 autocast trains the SAN 1.23× and the standard arm 1.78× faster
    than fp32. Without these instructions bf16 is emulated, so fp32 is the default there:
    on a 2-core AVX2 CPU a [4096, 128] @ [128, 128] product ran at 2.3 GFLOP/s in bf16
    against 53 in fp32, and the demo's SAN trained 2.5x faster in fp32.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def native_bf16(device: str) -> bool:
    """Whether bf16 products run natively on `device` ("cpu" or "cuda")."""
    if device != "cuda":
        return cpu_has_native_bf16()
    import torch

    return torch.cuda.is_bf16_supported()


# What a GPU driver shows in the file system where torch could see a device: NVIDIA's
# (bare metal and containers), AMD ROCm's (torch.cuda runs HIP) and WSL 2's GPU bridge
GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/dxg")


def cuda_available() -> bool:
    """`torch.cuda.is_available()`, without importing torch (~2 s) where it could not be
    true: on Linux with none of a GPU driver's files, and on macOS (no CUDA), unless torch
    is imported already. A study's process resolves its runs' `auto` device with this."""
    if "torch" not in sys.modules and (
            sys.platform == "darwin" or (sys.platform.startswith("linux")
                                         and not any(os.path.exists(f) for f in GPU_DRIVER_FILES))):
        return False
    import torch

    return torch.cuda.is_available()


def resolve_precision(precision: str, device: str) -> str:
    """`auto` as bf16 where `device` has bf16 products natively, else fp32; other values as they are."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"
