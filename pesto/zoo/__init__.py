"""TensorFlow model zoo: complete training steps with the paper's presets.

>>> from pesto.zoo import build_model, MODELS
>>> sorted(MODELS)
['nasnet', 'nmt', 'rnnlm', 'transformer']
"""
from __future__ import annotations

# OR-Tools' CP-SAT segfaults when TensorFlow (and its protobuf/absl) was
# loaded first; loading OR-Tools first makes both work in one process.
try:  # noqa: E402
    import ortools.sat.python.cp_model  # noqa: F401
except ImportError:  # pragma: no cover
    pass

from .common import ZooModel

__all__ = ["build_model", "MODELS", "ZooModel", "presets"]

MODELS = {
    "rnnlm": "pesto.zoo.rnnlm:build_rnnlm",
    "nmt": "pesto.zoo.nmt:build_nmt",
    "transformer": "pesto.zoo.transformer:build_transformer",
    "nasnet": "pesto.zoo.nasnet:build_nasnet",
}


def _builder(name):
    import importlib

    try:
        module, fn = MODELS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None
    return importlib.import_module(module), fn


def presets(name: str) -> list[str]:
    """Preset names of a model."""
    mod, _ = _builder(name)
    return list(mod.PRESETS)


def build_model(name: str, preset: str = "small", **overrides) -> ZooModel:
    """Build zoo model ``name`` with ``preset`` (and field ``overrides``)."""
    mod, fn = _builder(name)
    return getattr(mod, fn)(preset, **overrides)
