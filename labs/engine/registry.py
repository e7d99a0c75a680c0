"""Where labs sign in: the engine finds a lab by name here and never imports one.

Each lab package defines its `LAB` (labs/<lab>/__init__.py); the `labs` package installs a discovery
function that imports every lab package once and registers what it finds. The engine, the CLI and the
pages ask this registry, so adding a lab is adding a package: nothing else names it.
"""

from __future__ import annotations

from typing import Callable, Optional

from labs.engine.lab import Lab
from labs.engine.params import ParamError

_LABS: dict = {}
_discover: Optional[Callable[[], None]] = None


def register(lab: Lab) -> Lab:
    """Sign a lab in (idempotent: registering the same name again replaces it)."""
    _LABS[lab.name] = lab
    return lab


def set_discovery(discover: Callable[[], None]) -> None:
    """The function that imports every lab package; called once, the first time labs are asked for."""
    global _discover
    _discover = discover


def _ensure_discovered() -> None:
    global _discover
    if _discover is not None:
        discover, _discover = _discover, None
        discover()


def all_labs() -> tuple:
    """Every registered lab, in the order of the lab index."""
    _ensure_discovered()
    return tuple(sorted(_LABS.values(), key=lambda lab: (lab.order, lab.name)))


def get_lab(name: str) -> Lab:
    _ensure_discovered()
    if name not in _LABS:
        raise ParamError(f"unknown lab {name!r}; the labs are: {', '.join(l.name for l in all_labs())}.")
    return _LABS[name]
