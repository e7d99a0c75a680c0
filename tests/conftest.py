"""Test set-up shared by every test file.

- Without CUDA, Triton kernels run in its interpreter (TRITON_INTERPRET=1) on CPU tensors, so
  every kernel's correctness is checked in CI. This must be set before triton is imported.
- Tests that need a GPU are marked `gpu` and skip cleanly without one.
- The repository root is importable (`labs`, `ui`), as it is under `streamlit run app.py`.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# calibrations measured during tests must not land in the user's cache
os.environ.setdefault("ROOFLINE_CACHE", str(ROOT / "tests" / "artifacts" / "cache"))

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "browser: drives the served app in Chromium")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def device():
    """Where kernels run in tests: the GPU if there is one, else the CPU through Triton's interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
