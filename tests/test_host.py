"""CPU allocator settings (sanlab.train.host)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")

_PROBE = """
import resource, torch
from sanlab.train.host import tune_cpu_allocator
applied = tune_cpu_allocator()
assert tune_cpu_allocator() == applied  # idempotent
def step():  # keep activation-sized buffers alive, then free them all, as a training step does
    xs = [torch.empty(1 << 20).fill_(1.0) for _ in range(20)]  # 20 × 4 MiB
    del xs
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _probe(env_value: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True,
                         env={"SANLAB_MALLOC_TUNING": env_value, "PATH": ""}).stdout.split()
    return out[0] == "True", int(out[1])


def test_tuning_keeps_freed_buffers_instead_of_refaulting_them():
    """With the settings, the second step reuses the first step's freed pages; without
    them glibc hands the 80 MiB back to the kernel and every page faults in again."""
    applied, faults_tuned = _probe("1")
    off, faults_default = _probe("0")
    assert applied and not off
    assert faults_default > 10_000  # 20 × 4 MiB of fresh 4 KiB pages
    assert faults_tuned < faults_default / 2  # (0 to ~7,000 here: glibc places some blocks anew)
