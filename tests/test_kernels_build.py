"""The compiled kernels build here. Kept apart from test_native.py, whose tests are
skipped where the kernels are unavailable: a source that stops compiling would otherwise
turn every one of them into a skip, and the suite would pass on the torch fallbacks."""

import os

import pytest

from sanlab.model import native


def test_the_kernels_build_wherever_there_is_a_c_compiler():
    if os.environ.get("SANLAB_NATIVE") == "0":
        pytest.skip("SANLAB_NATIVE=0 turns the compiled kernels off")
    if native.compiler() is None:
        pytest.skip("no C compiler on the PATH")
    assert native.available(), native.unavailable_reason()
    assert native.abi_mismatch(native.library()) is None
