"""Test set-up shared by every test file.

- Without CUDA, Triton kernels run in its interpreter (TRITON_INTERPRET=1) on CPU tensors, so
  every kernel's correctness is checked in CI. This must be set before triton is imported.
- Tests that need a GPU are marked `gpu` and skip cleanly without one.
- The repository root is importable (`labs`, `ui`), as it is under `streamlit run app.py`.
"""

import contextlib
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
# ... nor the class store's submissions in the user's data folder (labs/classroom)
os.environ.setdefault("ROOFLINE_DB", str(ROOT / "tests" / "artifacts" / "classroom.sqlite3"))

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


def render_page(page: str, timeout: int = 60):
    """Run pages/<page> standalone in AppTest twice; the second render (caches warm) must take < 1 s.

    Returns the AppTest so a test can look at what the page shows. Fails on any exception.
    """
    import time

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / page), default_timeout=timeout)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    started = time.perf_counter()
    at.run()
    assert time.perf_counter() - started < 1.0
    assert not at.exception
    return at


@contextlib.contextmanager
def main_module_of_pytest():
    """Streamlit's script runner (AppTest) leaves a page's module as sys.modules['__main__']; a process that
    multiprocessing then spawns (a Dask worker) runs that page again as its main and exits with status 1
    ("Nanny failed to start"). Inside the block, __main__ is the one pytest started with."""
    current = sys.modules["__main__"]
    sys.modules["__main__"] = _PYTEST_MAIN
    try:
        yield
    finally:
        sys.modules["__main__"] = current


_PYTEST_MAIN = sys.modules["__main__"]  # conftest is imported before any test runs a page


# a worker process imports torch and Triton before it answers: on a busy 2-core CI machine that has taken
# more than Dask's default minute ("Nanny failed to start")
WORKER_START_S = 300


def cpu_pool_cluster():
    """A Dask LocalCluster of two CPU-only worker processes, each offering one "GPU" (the resources a GPU worker
    of labs.engine.pool offers), spawned with pytest's own __main__ and time to import torch."""
    from distributed import LocalCluster

    from labs.engine import pool

    with main_module_of_pytest():
        return LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None,
                            death_timeout=WORKER_START_S,
                            resources={pool.GPU_RESOURCE: 1, pool.KIND_PREFIX + pool.CPU_KIND: 1})
