"""GPT-style decoders and BERT-style encoders written with raw TF ops: the
zoo's models whose training with Adam does not fit one 16 GB V100.

* ``gpt``: pre-LN decoder (GPT-2/3, Megatron-LM): token + position
  embedding, per layer ``x + attention(LN(x))`` then ``x + mlp(LN(x))``
  (causal multi-head self-attention with one fused QKV projection, a GELU
  MLP of ``d_ff`` units, every projection with a bias), a final LN and an
  output projection over the vocabulary, next-token cross-entropy. Presets
  ``1.3b`` (24 layers, d_model 2048, 16 heads) and ``2.7b`` (32 layers,
  d_model 2560, 32 heads) at sequence 1024, vocabulary 50304 (GPT-2's 50257
  padded to a multiple of 128, as Megatron-LM does).
* ``bert``: post-LN encoder (BERT): token + position embedding and an LN,
  per layer ``LN(x + attention(x))`` then ``LN(x + mlp(x))`` (no mask), and
  a masked-LM head (dense + GELU + LN + projection) on every 8th position
  (12.5 % of the tokens, BERT masks 15 %). Preset ``large``: 24 layers,
  d_model 1024, 16 heads, sequence 512, vocabulary 30522, batch 32.

What is left out, so the graphs stay plain TF ops: dropout, BERT's token
types and next-sentence head, padding masks (every sequence is full length,
as in packed pre-training), and weight tying: the output projection has its
own weights (a tied embedding would make TensorFlow's embedding gradient a
sparse + dense sum). So GPT-1.3B has 1.42e9 parameters (1.31e9 tied) and
GPT-2.7B 2.78e9. All variables are float32, so weights and the two Adam
slots are 12 bytes per parameter of persistent memory: 17.0 GB (15.8 GiB)
for 1.3B, just under a 16 GiB V100 before any gradient (4 bytes more per
parameter, outputs of the backward ops) or activation; 33.3 GB for 2.7B
(``benchmarks/results/memory_bound.md`` has the activations too).

Scopes, so that gradient scopes mirror the forward ops and a layer's ops
are found by name: ``embed``, ``layer_<k>/{ln_0,attention,ln_1,mlp}``
(with the residual adds directly under ``layer_<k>``), ``ln_f`` (gpt),
``mlm`` (bert), ``output_projection``, ``loss``; gradients under
``gradients/<forward name>``, Adam updates under ``train/update_<var>``.
:mod:`tf_patch.zoo.tiling` builds the full-depth graphs from a profile of
one block.

Data: next-token prediction (gpt) or the tokens at the predicted positions
(bert) over the seeded Zipf corpus of :mod:`tf_patch.zoo.data`.

Examples
--------
>>> m = build_gpt("small", layers=1)                    # doctest: +SKIP
>>> sorted(m.config)[:3]                                # doctest: +SKIP
['batch', 'corpus', 'd_ff']
"""
from __future__ import annotations

import math

from ..extract import step_ops
from .common import MICRO_DEFAULTS, ZooModel, layer_norm, lazy_corpus, merge_preset, model_step, tf1
from .data import lm_batches

__all__ = ["build_gpt", "build_bert", "GPT_PRESETS", "BERT_PRESETS", "MLM_STRIDE", "parameters",
           "sparse_update_bytes"]

GPT_PRESETS = {
    "small": dict(layers=2, d_model=64, heads=4, d_ff=256, batch=4, seq=16, vocab=500),
    "1.3b": dict(layers=24, d_model=2048, heads=16, d_ff=8192, batch=16, seq=1024, vocab=50304),
    "2.7b": dict(layers=32, d_model=2560, heads=32, d_ff=10240, batch=16, seq=1024, vocab=50304),
}
BERT_PRESETS = {
    "small": dict(layers=2, d_model=64, heads=4, d_ff=256, batch=4, seq=16, vocab=500),
    "large": dict(layers=24, d_model=1024, heads=16, d_ff=4096, batch=32, seq=512, vocab=30522),
}
_DEFAULTS = dict(optimizer="adam", lr=3e-4, seed=0, corpus="zipf", **MICRO_DEFAULTS)
#: BERT's masked-LM head predicts every ``MLM_STRIDE``-th position.
MLM_STRIDE = 8


def parameters(cfg: dict, kind: str = "gpt") -> int:
    """Trainable parameters of a resolved preset (the variables' sizes).

    >>> parameters(GPT_PRESETS["1.3b"])
    1416795264
    >>> parameters(GPT_PRESETS["2.7b"])
    2777880704
    """
    L, D, F, S, V = (cfg[k] for k in ("layers", "d_model", "d_ff", "seq", "vocab"))
    block = 4 * D * D + 4 * D + 2 * D * F + F + D + 4 * D  # qkv, proj, mlp, two LNs
    embed = V * D + S * D
    head = D * V + V + (2 * D if kind == "gpt" else D * D + D + 2 * D + 2 * D)  # bert: + embed/ln
    return L * block + embed + head


def sparse_update_bytes(model: ZooModel) -> dict[str, int]:
    """Tensor name -> bytes for the step's tensors of unknown leading dimension:
    Adam's sparse update of the embedding (``train/update_embed/embedding``),
    one row per distinct token of the batch, at most ``min(vocab, batch * seq)``
    rows (the bound, so the memory is not undercounted). For
    :func:`tf_patch.extract.extract`'s ``tensor_sizes``."""
    cfg = model.config
    rows = min(cfg["vocab"], cfg["batch"] * cfg["seq"])
    out = {}
    for op in step_ops(model.graph, model.fetches):
        for x in op.outputs:
            dims = x.shape.as_list() if x.shape.rank else None
            if dims and dims[0] is None and all(d is not None for d in dims[1:]):
                out[x.name] = int(rows * math.prod(dims[1:]) * x.dtype.size)
    return out


def _layer_norm(x, scope: str, d: int):
    return layer_norm(x, scope, d, eps=1e-5)


def _dense(x2d, n_in: int, n_out: int, scope: str, init):
    """``x2d @ w + b`` with its variables under ``scope``."""
    t = tf1()
    with t.variable_scope(scope):
        w = t.get_variable("w", [n_in, n_out], initializer=init)
        b = t.get_variable("b", [n_out], initializer=t.zeros_initializer())
        return t.nn.bias_add(t.matmul(x2d, w), b)


def _attention(x, cfg: dict, b: int, init, mask):
    """Multi-head self-attention of ``x`` ``[b, S, D]`` (one fused QKV
    projection); ``mask`` ``[S, S]`` is added to the scores (None: none)."""
    t = tf1()
    S, D, H = cfg["seq"], cfg["d_model"], cfg["heads"]
    dk = D // H
    with t.variable_scope("attention"):
        qkv = _dense(t.reshape(x, [b * S, D]), D, 3 * D, "qkv", init)
        q, k, v = (t.transpose(t.reshape(z, [b, S, H, dk]), [0, 2, 1, 3]) for z in t.split(qkv, 3, axis=1))
        scores = t.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(dk))
        if mask is not None:
            scores = scores + mask
        o = t.reshape(t.transpose(t.matmul(t.nn.softmax(scores), v), [0, 2, 1, 3]), [b * S, D])
        return t.reshape(_dense(o, D, D, "proj", init), [b, S, D])


def _gelu(x):
    """GELU, tanh approximation (GPT-2, BERT), as its elementwise ops."""
    t = tf1()
    with t.name_scope("gelu"):
        return 0.5 * x * (1.0 + t.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _mlp(x, cfg: dict, b: int, init):
    t = tf1()
    S, D, F = cfg["seq"], cfg["d_model"], cfg["d_ff"]
    with t.variable_scope("mlp"):
        hdn = _gelu(_dense(t.reshape(x, [b * S, D]), D, F, "fc", init))
        return t.reshape(_dense(hdn, F, D, "out", init), [b, S, D])


def _block(x, cfg: dict, b: int, init, mask, pre_ln: bool):
    """One layer (in the caller's ``layer_<k>`` scope): pre-LN (gpt) or post-LN (bert)."""
    t = tf1()
    D = cfg["d_model"]
    if pre_ln:
        x = t.add(x, _attention(_layer_norm(x, "ln_0", D), cfg, b, init, mask), name="residual_0")
        return t.add(x, _mlp(_layer_norm(x, "ln_1", D), cfg, b, init), name="residual_1")
    x = _layer_norm(t.add(x, _attention(x, cfg, b, init, mask), name="residual_0"), "ln_0", D)
    return _layer_norm(t.add(x, _mlp(x, cfg, b, init), name="residual_1"), "ln_1", D)


def _embed(ids, cfg: dict, init):
    t = tf1()
    V, S, D = cfg["vocab"], cfg["seq"], cfg["d_model"]
    with t.variable_scope("embed"):
        emb = t.get_variable("embedding", [V, D], initializer=init)
        pos = t.get_variable("position", [S, D], initializer=init)
        return t.nn.embedding_lookup(emb, ids) + pos


def _loss(x2d, labels, n_in: int, vocab: int, init):
    """Logits (``output_projection``) and the mean cross-entropy (``loss``)."""
    t = tf1()
    logits = _dense(x2d, n_in, vocab, "output_projection", init)
    with t.name_scope("loss"):
        return t.reduce_mean(t.nn.sparse_softmax_cross_entropy_with_logits(
            labels=t.reshape(labels, [-1]), logits=logits))


def _gpt_forward(cfg: dict, init):
    """``forward(inputs, b) -> loss`` of the decoder."""
    import numpy as np
    t = tf1()
    L, S, D = cfg["layers"], cfg["seq"], cfg["d_model"]

    def forward(inputs, b):
        x_in, y_in = inputs
        x = _embed(x_in, cfg, init)
        mask = t.constant(np.triu(np.full((S, S), -1e9, np.float32), 1), name="causal_mask")
        for k in range(L):
            with t.variable_scope(f"layer_{k}"):
                x = _block(x, cfg, b, init, mask, pre_ln=True)
        x = _layer_norm(x, "ln_f", D)
        return _loss(t.reshape(x, [b * S, D]), y_in, D, cfg["vocab"], init)
    return forward


def _bert_forward(cfg: dict, init):
    """``forward(inputs, b) -> loss`` of the encoder with its masked-LM head."""
    t = tf1()
    L, S, D = cfg["layers"], cfg["seq"], cfg["d_model"]
    P = S // MLM_STRIDE

    def forward(inputs, b):
        x_in, y_in = inputs
        x = _layer_norm(_embed(x_in, cfg, init), "embed/ln", D)
        for k in range(L):
            with t.variable_scope(f"layer_{k}"):
                x = _block(x, cfg, b, init, None, pre_ln=False)
        with t.variable_scope("mlm"):
            picked = t.reshape(x[:, ::MLM_STRIDE, :], [b * P, D])
            h = _layer_norm(_gelu(_dense(picked, D, D, "transform", init)), "ln", D)
        return _loss(h, y_in, D, cfg["vocab"], init)
    return forward


def _build(kind: str, presets: dict, preset: str, overrides: dict) -> ZooModel:
    cfg = merge_preset({k: {**v, **_DEFAULTS} for k, v in presets.items()}, kind, preset, overrides)
    if cfg["d_model"] % cfg["heads"]:
        raise ValueError(f"{kind}: d_model {cfg['d_model']} is not a multiple of heads {cfg['heads']}")
    t = tf1()
    import tensorflow as tf

    B, S, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    n_targets = S if kind == "gpt" else S // MLM_STRIDE
    graph = tf.Graph()
    with graph.as_default():
        t.set_random_seed(cfg["seed"])
        init = t.random_normal_initializer(stddev=0.02, seed=cfg["seed"])
        x_ph = t.placeholder(tf.int32, [B, S], name="inputs")
        y_ph = t.placeholder(tf.int32, [B, n_targets], name="targets")
        forward = (_gpt_forward if kind == "gpt" else _bert_forward)(cfg, init)
        loss, train_op = model_step(forward, [x_ph, y_ph], cfg)
        init_op = t.global_variables_initializer()

    ids = lazy_corpus(V, max(B * (S + 1) * 50, 20000), cfg)

    def feed_fn(step: int) -> dict:
        xb, yb = lm_batches(ids(), B, S, step)
        if kind == "bert":  # the masked positions' own tokens, the inputs there masked (id 0)
            yb = xb[:, ::MLM_STRIDE].copy()
            xb = xb.copy()
            xb[:, ::MLM_STRIDE] = 0
        return {x_ph: xb, y_ph: yb}

    return ZooModel(graph, train_op, loss, feed_fn, kind, cfg, init_op)


def build_gpt(preset: str = "small", **overrides) -> ZooModel:
    """Build the GPT decoder's training step (see module docstring); ``overrides``
    change preset fields (layers, d_model, heads, d_ff, batch, seq, vocab) or
    optimizer, lr, seed, corpus, micro_batches, mirrored."""
    return _build("gpt", GPT_PRESETS, preset, overrides)


def build_bert(preset: str = "small", **overrides) -> ZooModel:
    """Build the BERT encoder's masked-LM training step (see module docstring)."""
    return _build("bert", BERT_PRESETS, preset, overrides)
