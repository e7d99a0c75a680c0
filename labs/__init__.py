"""Roofline's engine: GPU detection, ceilings, timing, results, the runner, and one module per lab.

Nothing here imports streamlit: the same code serves the app, the CLI (`python -m labs`) and the tests.
Lab modules are found by looking for a module-level `LAB` object, so adding a lab is adding a file.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

# modules of the engine itself; every other module in this package that defines LAB is a lab
ENGINE_MODULES = {"bench", "cache", "calibration", "counters", "glossary", "gpu", "lab", "params", "pool", "results", "runner"}


@functools.lru_cache(maxsize=1)
def all_labs() -> tuple:
    """Every lab, in the order of the lab index."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name in ENGINE_MODULES or info.name.startswith("_") or info.ispkg:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "LAB"):
            found.append(module.LAB)
    return tuple(sorted(found, key=lambda lab: (lab.order, lab.name)))


def get_lab(name: str):
    from labs.params import ParamError

    for lab in all_labs():
        if lab.name == name:
            return lab
    raise ParamError(f"unknown lab {name!r}; the labs are: {', '.join(l.name for l in all_labs())}.")
