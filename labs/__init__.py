"""Roofline's labs: the engine (labs/engine/) and one package per lab (labs/<lab>/).

Nothing here imports streamlit: the same code serves the app, the CLI (`python -m labs`) and the tests.
A lab is a package that defines a module-level `LAB`; `all_labs()` imports each package once and signs
its LAB in with the engine's registry, so adding a lab is adding a package.
"""

from __future__ import annotations

import importlib
import pkgutil

from labs.engine import registry

# packages here that are not labs: the engine and the parts built on it
NOT_LABS = {"engine", "workbench", "glossary", "classroom", "memcalc"}


def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name in NOT_LABS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "LAB"):
            registry.register(module.LAB)


registry.set_discovery(_discover)


def all_labs() -> tuple:
    """Every lab, in the order of the lab index."""
    return registry.all_labs()


def get_lab(name: str):
    return registry.get_lab(name)
