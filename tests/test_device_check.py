"""scripts/device_check.sh parses, and the `gpu` tests it runs collect (the GPU run itself
is the script's; its CPU dry run is `DRY_RUN=1 bash scripts/device_check.sh`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_device_check_parses():
    proc = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "device_check.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_gpu_tests_collect():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           "--collect-only", "tests/test_gpu.py", "tests/test_model.py"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    sys.path.insert(0, str(ROOT / "tests"))
    import test_gpu  # the parametrisation the collected count follows

    # test_gpu.py: one test per attending mixer and 12 others (three tests in 2 variants each); test_model.py: 1
    expected = len(test_gpu.ATTENDING) + 12 + 1
    assert f"{expected}/" in proc.stdout.splitlines()[-1], proc.stdout[-500:]
    for mixer, layout in test_gpu.ATTENDING:
        assert f"test_compiled_equals_eager_on_packed_documents[{mixer}-{layout}]" in proc.stdout
