"""Subpackages loaded on first use: ``labkit.lessons.plots`` works after ``import labkit``."""

from __future__ import annotations

import importlib
import importlib.util


def submodules(package: str):
    """A module ``__getattr__`` (PEP 562) that imports ``package.<name>`` when asked for it."""

    def __getattr__(name: str):
        if name.startswith("__") or importlib.util.find_spec(f"{package}.{name}") is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return importlib.import_module(f"{package}.{name}")

    return __getattr__
