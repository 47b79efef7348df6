"""TensorFlow model zoo: complete training steps with the paper's presets.

>>> from tf_patch.zoo import build_model, MODELS
>>> sorted(MODELS)
['bert', 'gpt', 'nasnet', 'nmt', 'rnnlm', 'transformer']
"""
from __future__ import annotations

from .. import needs_tf  # noqa: F401  (an ImportError naming the tf extra without TensorFlow)
from . import gpt, nasnet, nmt, rnnlm, transformer
from .common import ZooModel

__all__ = ["build_model", "MODELS", "ZooModel", "presets"]

#: model name -> (its builder ``build(preset, **overrides) -> ZooModel``, its presets)
MODELS = {
    "rnnlm": (rnnlm.build_rnnlm, rnnlm.PRESETS),
    "nmt": (nmt.build_nmt, nmt.PRESETS),
    "transformer": (transformer.build_transformer, transformer.PRESETS),
    "nasnet": (nasnet.build_nasnet, nasnet.PRESETS),
    "gpt": (gpt.build_gpt, gpt.GPT_PRESETS),
    "bert": (gpt.build_bert, gpt.BERT_PRESETS),
}


def _model(name: str):
    """``(builder, presets)`` of model ``name``; ValueError names the known ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None


def presets(name: str) -> list[str]:
    """Preset names of a model."""
    return list(_model(name)[1])


def build_model(name: str, preset: str = "small", **overrides) -> ZooModel:
    """Build zoo model ``name`` with ``preset`` (and field ``overrides``)."""
    return _model(name)[0](preset, **overrides)
