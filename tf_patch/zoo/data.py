"""Offline training data for the zoo: no download, ever.

Two token sources, both deterministic:

* ``"zipf"`` (default): a seeded synthetic corpus whose token frequencies follow
  a Zipf law (exponent 1.1) over the vocabulary, with a little local structure
  (each token is, with probability 0.5, a fixed function of the previous one) so
  that a language model's loss visibly falls within a few dozen steps.
* ``"stdlib"``: the words of Python's own standard-library sources (the
  ``.py`` files next to :mod:`os`, read in sorted order), mapped to ids by
  frequency; words outside the ``vocab - 1`` most frequent become id 0 (unk).

Examples
--------
>>> ids = corpus(100, 1000, seed=0)
>>> ids.shape, int(ids.min()) >= 0, int(ids.max()) < 100
((1000,), True, True)
"""
from __future__ import annotations

import os
import re
from collections import Counter

import numpy as np

__all__ = ["corpus", "lm_batches", "translation_pair"]

_WORD = re.compile(r"[A-Za-z_]+|[^\sA-Za-z_]")


def corpus(vocab: int, n_tokens: int, *, source: str = "zipf", seed: int = 0) -> np.ndarray:
    """``n_tokens`` int32 ids in ``[0, vocab)`` from ``source`` ("zipf" or "stdlib")."""
    if vocab < 2:
        raise ValueError(f"vocab must be >= 2, got {vocab}")
    if source == "zipf":
        rng = np.random.default_rng(seed)
        p = 1.0 / np.arange(1, vocab + 1) ** 1.1
        p /= p.sum()
        draws = rng.choice(vocab, size=n_tokens, p=p).astype(np.int32)
        follow = rng.random(n_tokens) < 0.5
        nxt = (np.arange(vocab) * 7 + 3) % vocab  # a fixed successor for each token
        out = draws.copy()
        for i in range(1, n_tokens):
            if follow[i]:
                out[i] = nxt[out[i - 1]]
        return out
    if source == "stdlib":
        words = _stdlib_words(max_words=max(n_tokens, 10000))
        ranks = {w: i + 1 for i, (w, _) in enumerate(Counter(words).most_common(vocab - 1))}
        ids = np.array([ranks.get(w, 0) for w in words], dtype=np.int32)
        reps = -(-n_tokens // len(ids))
        return np.tile(ids, reps)[:n_tokens]
    raise ValueError(f"unknown corpus source {source!r}; use 'zipf' or 'stdlib'")


def _stdlib_words(max_words: int) -> list[str]:
    root = os.path.dirname(os.__file__)
    words: list[str] = []
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                words.extend(_WORD.findall(f.read()))
        except (OSError, UnicodeDecodeError):
            continue
        if len(words) >= max_words:
            break
    if not words:  # a stripped Python without sources: fall back to the Zen of Python
        import codecs
        import this  # noqa: F401  (prints once; its text is rot13 in this.s)
        words = _WORD.findall(codecs.decode(this.s, "rot13"))
    return words


def lm_batches(ids: np.ndarray, batch: int, steps: int, step: int):
    """Inputs and next-token targets ``[batch, steps]`` for training step ``step``
    (the corpus is cut into ``batch`` rows read left to right, as in PTB)."""
    rows = len(ids) // batch
    data = ids[: rows * batch].reshape(batch, rows)
    n = (rows - 1) // steps
    if n < 1:
        raise ValueError(f"corpus of {len(ids)} tokens too short for batch {batch} x steps {steps}")
    i = (step % n) * steps
    return data[:, i:i + steps], data[:, i + 1:i + 1 + steps]


def translation_pair(ids: np.ndarray, batch: int, src_len: int, tgt_len: int, vocab: int, step: int):
    """A synthetic translation task: the target is the source reversed and
    shifted by a fixed token map, so an attention model can learn it.

    Returns ``(src, tgt_in, tgt_out)``; ``tgt_in`` starts with id 1 (BOS)."""
    per = batch * src_len
    n = max(1, len(ids) // per)
    src = ids[(step % n) * per:(step % n) * per + per].reshape(batch, src_len)
    mapped = (src[:, ::-1] * 3 + 5) % vocab
    tgt = np.resize(mapped, (batch, tgt_len)) if tgt_len != src_len else mapped
    tgt_in = np.concatenate([np.ones((batch, 1), np.int32), tgt[:, :-1]], axis=1)
    return src.astype(np.int32), tgt_in.astype(np.int32), tgt.astype(np.int32)
