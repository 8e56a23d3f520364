"""Host facts and settings (sanlab.train.host): the CPU allocator, and whether torch could see a GPU."""

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


# --------------------------------------------------------------------------- cuda_available

def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_without_a_gpu_driver_cuda_is_not_asked_of_torch() -> None:
    """A study's process resolves `train.device=auto` as the CPU without importing torch
    where no GPU driver's file exists."""
    from torch_block import BLOCK_TORCH

    proc = _python(BLOCK_TORCH + "from sanlab.train import host\n"
                   "host.GPU_DRIVER_FILES = ('/nonexistent/nvidiactl',)\n"
                   "assert host.cuda_available() is False\n"
                   "from sanlab.config import Config\n"
                   "from sanlab.train.resolve import resolve\n"
                   "assert resolve(Config.model_validate({'train': {'device': 'auto'}})).train.device == 'cpu'\n"
                   "assert 'torch' not in sys.modules\n")
    assert proc.returncode == 0, proc.stderr


def test_with_a_gpu_driver_torch_is_asked(tmp_path) -> None:  # noqa: ANN001
    driver = tmp_path / "nvidiactl"
    driver.write_text("")
    proc = _python("import sys\n"
                   "from sanlab.train import host\n"
                   f"host.GPU_DRIVER_FILES = ({str(driver)!r},)\n"
                   "got = host.cuda_available()\n"
                   "assert 'torch' in sys.modules, 'torch was not asked'\n"
                   "import torch\n"
                   "assert got == torch.cuda.is_available()\n")
    assert proc.returncode == 0, proc.stderr


def test_once_torch_is_imported_it_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch is imported already (a trainer, a test that fakes a GPU) its answer
    counts, driver files or not."""
    import torch

    from sanlab.config import Config
    from sanlab.train import host
    from sanlab.train.resolve import resolve

    monkeypatch.setattr(host, "GPU_DRIVER_FILES", ())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert host.cuda_available() is True
    cfg = resolve(Config.model_validate({"train": {"device": "auto", "precision": "auto"}}))
    assert (cfg.train.device, cfg.train.precision, cfg.train.compile) == ("cuda", "bf16", True)
