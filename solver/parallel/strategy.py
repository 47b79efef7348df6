"""How a step is run (:class:`Strategy`) and a plan with what it solved (:class:`Solved`).

A strategy is data: ``replicas`` data-parallel copies of the step, each cut
into ``stages`` pipeline stages and split into ``micro_batches`` slices,
run by ``schedule``. Data parallelism is one stage, a pipeline one replica,
a hybrid both; the plain step is ``Strategy()``.

Memory savers, two more fields: ``recompute`` (``True``: every layer
block's activations recomputed before its backward, :func:`pesto.step.recompute`;
a tuple with one **level** per layer block of :func:`pesto.step.recompute.layer_blocks`:
``False`` none, ``"cheap"`` its cheap ops only, ``True`` every op; any kind but
the slice model) and ``shard_optimizer`` (``1``, ``2`` or ``3``:
ZeRO-1 / ZeRO-2, each replica updating its shard of the optimizer state; ZeRO-3 (FSDP), the
parameters sharded too and gathered for their readers, :func:`pesto.step.replicate`; data parallelism only). Both show in the
name (``"data-parallel R=8 M=2 ZeRO-2"``, ``"1f1b K=4 M=8 recompute"``,
``"zb-h1 K=4 M=8 recompute(3/4:0-1,3)"``: 3 of 4 blocks, blocks 0, 1 and 3).
A block's cheap ops (:func:`pesto.step.recompute.cheap_ops`: a transformer layer's element-wise
ops, softmax and attention scores, not its projections: most of the memory
for a fifth of the forward time) are selective recomputation: ``selective``
with ``recompute=True`` for every block (``"recompute-cheap"``), ``"cheap"``
per block in a tuple (``"recompute-cheap(2/4:1-2)"``; with blocks of every op:
``"recompute(1/4:0)+cheap(2/4:1-2)"``). One form per plan: a tuple of one level for
every block is ``True`` (with ``selective`` for ``"cheap"``) or ``False``, and
``selective`` with a tuple makes its ``True`` blocks ``"cheap"``.

Schedules: those of :data:`solver.parallel.schedules.SCHEDULES` (``"gpipe"``,
``"1f1b"``, ``"interleaved"``, ``"zb-h1"``, ``"zb-h2"``, ``"zb-v"``: fixed
orders of the slices' forward, backward and weight-gradient tasks per
device), ``"free"`` (Pesto's own placement and order of
the transformed step: the exact pipeline), ``"slice"`` (the slice model's
block x slice grid), ``"none"`` (no pipeline: the plain step or data
parallelism).

Examples
--------
>>> Strategy(replicas=4).name, Strategy(stages=2, micro_batches=8, schedule="1f1b").name
('data-parallel R=4', '1f1b K=2 M=8')
>>> Strategy(replicas=2, stages=2, micro_batches=4, schedule="1f1b").kind
'replicated'
>>> Strategy(micro_batches=0)
Traceback (most recent call last):
...
ValueError: Strategy.micro_batches must be an integer >= 1, got 0
>>> Strategy(replicas=8, shard_optimizer=2, recompute=True).name
'data-parallel R=8 ZeRO-2 recompute'
>>> Strategy(stages=4, micro_batches=8, schedule="zb-h1", recompute=(True, True, False, True)).name
'zb-h1 K=4 M=8 recompute(3/4:0-1,3)'
>>> Strategy(recompute=(True, True)).recompute, Strategy(recompute=(False,)).recompute
(True, False)
>>> Strategy(stages=2, micro_batches=4, schedule="1f1b", recompute=(True, False), selective=True).name
'1f1b K=2 M=4 recompute-cheap(1/2:0)'
>>> mix = Strategy(replicas=8, shard_optimizer=2, recompute=(True, "cheap", "cheap", False))
>>> mix.name, mix.levels(4)
('data-parallel R=8 ZeRO-2 recompute(1/4:0)+cheap(2/4:1-2)', ('full', 'cheap', 'cheap', 'none'))
>>> Strategy(recompute=("cheap", "cheap")).savers, Strategy(recompute=True, selective=True).levels(2)
('recompute-cheap', ('cheap', 'cheap'))
>>> Strategy(stages=2, micro_batches=4, schedule="1f1b", shard_optimizer=1)
Traceback (most recent call last):
...
ValueError: Strategy.shard_optimizer=1 shards the optimizer state over replicas: it needs replicas > 1, got 1
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from pesto.graph import OpGraph
from pesto.plan import Plan
from pesto.step import Origin, Transformed, identity
from pesto.step.replication import BUCKET_BYTES, SHARD_LEVELS
from pesto.step.slicing import WEIGHT_GRADS

from .schedules import SCHEDULES

__all__ = ["Strategy", "Solved", "SCHEDULE_NAMES", "LEVELS", "recompute_mask"]

#: The schedules a strategy may name (see the module doc).
SCHEDULE_NAMES = ("none", "free", "slice", *SCHEDULES)
#: A layer block's recomputation levels, least first (:meth:`Strategy.levels`): none, its
#: cheap ops only (:func:`pesto.step.recompute.cheap_ops`), every op; ``recompute`` tuples hold
#: them as ``False``, ``"cheap"``, ``True``.
LEVELS = ("none", "cheap", "full")
_LEVEL_OF = {False: "none", "cheap": "cheap", True: "full"}


@dataclass(frozen=True)
class Strategy:
    """One point of the plan space (module doc). For a pipeline schedule
    before it is realised, ``stages`` is the most stages the cutter may use
    (:func:`solver.parallel.realise.realise` picks the count; the result's
    strategy has the count used). ``weight_grads``: how the slices' weight
    gradients are summed (:func:`pesto.step.split`'s rule, one of
    :data:`pesto.step.slicing.WEIGHT_GRADS`: ``"separate"`` accumulate ops,
    what TensorFlow's split step runs; ``"accumulate"`` in place;
    ``"whole"`` one op over all slices), or a mapping weight-gradient op ->
    rule (the ops left out ``"separate"``; kept as a sorted tuple of pairs,
    :attr:`split_rule` gives the split's form, :attr:`joined` the ops run
    whole), passed by the realisers to the split (the slice model takes
    ``"separate"`` only); a rule other than ``"separate"`` shows in the name
    (``"zb-h1 K=4 M=8 whole(4)"``: four ops joined; ``"zb-h2 K=4 M=8
    accumulate(4)"``: four summed in place, :attr:`in_place`). ``recompute`` and
    ``shard_optimizer``: the memory savers (module doc). ``split_backward``
    is reserved (a schedule says itself whether it splits the backward:
    :attr:`solver.parallel.schedules.Schedule.split_backward`) and must keep
    its default."""

    replicas: int = 1
    stages: int = 1
    micro_batches: int = 1
    schedule: str = "none"
    bucket_bytes: int | None = BUCKET_BYTES
    recompute: bool | tuple = False
    shard_optimizer: int = 0
    split_backward: bool = False
    weight_grads: str | tuple = "separate"
    selective: bool = False

    def __post_init__(self):
        for name in ("replicas", "stages", "micro_batches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Strategy.{name} must be an integer >= 1, got {v!r}")
        if self.schedule not in SCHEDULE_NAMES:
            raise ValueError(f"Strategy.schedule {self.schedule!r} is unknown; known: {', '.join(SCHEDULE_NAMES)}")
        wg = self.weight_grads
        if isinstance(wg, Mapping) or isinstance(wg, tuple):
            wg = tuple(sorted(dict(wg).items()))
            object.__setattr__(self, "weight_grads", wg)
            bad = [r for _, r in wg if r not in WEIGHT_GRADS]
        else:
            bad = [] if wg in WEIGHT_GRADS else [wg]
        if bad:
            raise ValueError(f"Strategy.weight_grads {bad[0]!r} is unknown; known: {', '.join(WEIGHT_GRADS)}")
        self._canonical_recompute()
        if not isinstance(self.selective, bool) or (self.selective and not self.recompute):
            raise ValueError(f"Strategy.selective (recompute a block's cheap ops only) must be a bool, and "
                             f"True only with recompute, got selective={self.selective!r}, "
                             f"recompute={self.recompute!r}")
        if isinstance(self.shard_optimizer, bool) or self.shard_optimizer not in SHARD_LEVELS:
            raise ValueError(f"Strategy.shard_optimizer must be one of {SHARD_LEVELS} (none, ZeRO-1, ZeRO-2, ZeRO-3), "
                             f"got {self.shard_optimizer!r}")
        if self.shard_optimizer and self.replicas < 2:
            raise ValueError(f"Strategy.shard_optimizer={self.shard_optimizer} shards the optimizer state over "
                             f"replicas: it needs replicas > 1, got {self.replicas}")
        if self.split_backward:
            raise ValueError("split_backward is not supported yet")

    def _canonical_recompute(self) -> None:
        """``recompute`` and ``selective`` in their one form (module doc), or ValueError."""
        rc = self.recompute
        if isinstance(rc, bool):
            return
        if (not isinstance(rc, (tuple, list)) or not rc
                or not all(x is True or x is False or x == "cheap" for x in rc)):
            raise ValueError(f"Strategy.recompute must be True, False or one level per layer block (a non-empty "
                             f"tuple of False, 'cheap', True), got {rc!r}")
        if self.selective is True:   # its blocks recomputed: their cheap ops only
            rc = tuple("cheap" if x is True else x for x in rc)
        uniform = set(rc)
        if len(uniform) == 1:
            level = uniform.pop()
            object.__setattr__(self, "recompute", bool(level))
            object.__setattr__(self, "selective", level == "cheap")
            return
        object.__setattr__(self, "recompute", tuple(rc))
        if self.selective is True:
            object.__setattr__(self, "selective", False)

    def levels(self, blocks: int) -> tuple[str, ...]:
        """Per layer block of ``blocks``, its recomputation level (:data:`LEVELS`).

        Raises
        ------
        ValueError
            ``recompute`` names another count of blocks.
        """
        rc = self.recompute
        if isinstance(rc, tuple):
            if len(rc) != blocks:
                raise ValueError(f"{self.name}: recompute names {len(rc)} layer blocks, the step has {blocks}")
            return tuple(_LEVEL_OF[x] for x in rc)
        return (("cheap" if self.selective else "full") if rc else "none",) * blocks

    @property
    def kind(self) -> str:
        """The graph a plan of it places: ``"step"``, ``"micro-batched"`` or ``"replicated"``."""
        return "replicated" if self.replicas > 1 else "micro-batched" if self.micro_batches > 1 else "step"

    @property
    def savers(self) -> str:
        """The memory savers in words: ``""``, ``"ZeRO-2"``, ``"recompute"``, ``"ZeRO-1 recompute"``."""
        return " ".join(w for w in (f"ZeRO-{self.shard_optimizer}" if self.shard_optimizer else "",
                                    self.recompute_words) if w)

    @property
    def recompute_words(self) -> str:
        """``recompute`` in words: ``""``, ``"recompute"`` (every block) or
        ``"recompute(k/n:ranges)"`` (``k`` of ``n`` blocks; :func:`recompute_mask` reads it back),
        ``"recompute-cheap..."`` when :attr:`selective` or its blocks are ``"cheap"``;
        blocks of both levels: ``"recompute(k/n:ranges)+cheap(j/n:ranges)"``."""
        rc = self.recompute
        if not isinstance(rc, tuple):
            return ("recompute-cheap" if self.selective else "recompute") if rc else ""
        full, cheap = _blocks_word([x is True for x in rc]), _blocks_word([x == "cheap" for x in rc])
        if full and cheap:
            return f"recompute{full}+cheap{cheap}"
        return f"recompute{full}" if full else f"recompute-cheap{cheap}"

    @property
    def recomputed(self) -> tuple[int, ...] | None:
        """The indices of the layer blocks recomputed (at any level): None for every block
        (``recompute=True``), () for none."""
        rc = self.recompute
        return tuple(i for i, x in enumerate(rc) if x is not False) if isinstance(rc, tuple) else (None if rc else ())

    @property
    def split_rule(self):
        """:attr:`weight_grads` as :func:`pesto.step.split` takes it (a rule, or a dict op -> rule)."""
        return self.weight_grads if isinstance(self.weight_grads, str) else dict(self.weight_grads)

    @property
    def joined(self) -> tuple:
        """The weight-gradient ops a mapping runs whole, sorted (() for a rule given for all)."""
        return () if isinstance(self.weight_grads, str) else tuple(op for op, r in self.weight_grads if r == "whole")

    @property
    def in_place(self) -> tuple:
        """The weight-gradient ops a mapping accumulates in place, sorted (() for a rule given for all)."""
        return () if isinstance(self.weight_grads, str) else tuple(op for op, r in self.weight_grads
                                                                   if r == "accumulate")

    @property
    def rule_words(self) -> str:
        """The weight-gradient rule in words: ``""`` (``"separate"``), ``"whole"``,
        ``"accumulate"``, or for a mapping ``"whole(k)"`` (``k`` ops joined) and
        ``"accumulate(j)"`` (``j`` ops summed in place).

        >>> Strategy(weight_grads={"b": "whole", "a": "whole"}).rule_words, Strategy().rule_words
        ('whole(2)', '')
        >>> Strategy(weight_grads={"a": "whole", "b": "accumulate", "c": "accumulate"}).rule_words
        'whole(1) accumulate(2)'
        """
        if isinstance(self.weight_grads, str):
            return "" if self.weight_grads == "separate" else self.weight_grads
        return " ".join(f"{w}({len(ops)})" for w, ops in (("whole", self.joined), ("accumulate", self.in_place))
                        if ops)

    @property
    def name(self) -> str:
        """A short name: ``"data-parallel R=4"``, ``"1f1b K=2 M=8"``, ``"hybrid R=2 K=2 M=4"``
        (1F1B; another schedule after it: ``"hybrid R=2 K=2 M=4 zb-h1"``),
        the weight-gradient rule and the savers after it (``"data-parallel R=4 ZeRO-1"``,
        ``"zb-h1 K=4 M=8 whole(4)"``)."""
        return " ".join(w for w in (self._base_name(), self.bucket_words, self.rule_words, self.savers) if w)

    @property
    def bucket_words(self) -> str:
        """The gradient buckets of a replicated strategy when not DDP's default
        (:data:`pesto.step.replication.BUCKET_BYTES`): ``"buckets=12.5MiB"``,
        ``"buckets=off"`` (one ring per tensor); ``""`` otherwise.

        >>> Strategy(replicas=4, bucket_bytes=BUCKET_BYTES // 2).name
        'data-parallel R=4 buckets=12.5MiB'
        """
        if self.replicas == 1 or self.bucket_bytes == BUCKET_BYTES:
            return ""
        return "buckets=off" if not self.bucket_bytes else f"buckets={self.bucket_bytes / 2**20:g}MiB"

    def _base_name(self) -> str:
        m = f" M={self.micro_batches}" if self.micro_batches > 1 else ""
        if self.replicas > 1:
            if self.stages > 1:
                return f"hybrid R={self.replicas} K={self.stages}{m}" + ("" if self.schedule in ("1f1b", "none")
                                                                          else f" {self.schedule}")
            return f"data-parallel R={self.replicas}{m}"
        if self.schedule in SCHEDULES:
            return f"{self.schedule} K={self.stages}{m}"
        return ("step" if self.schedule == "none" else self.schedule) + m


def _blocks_word(on: list[bool]) -> str:
    """``"(k/n:ranges)"`` of the blocks ``on`` says (``""`` for none)."""
    idx = [i for i, x in enumerate(on) if x]
    runs: list[list[int]] = []
    for i in idx:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    ranges = ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"({len(idx)}/{len(on)}:{ranges})" if idx else ""


def _blocks_of(word: str, part: str, head: str) -> tuple[int, set[int]]:
    """``(n, blocks)`` of one ``head(k/n:ranges)`` part of ``word``, or ValueError."""
    found = re.fullmatch(re.escape(head) + r"\((\d+)/(\d+):([\d,-]+)\)", part)
    if found is None:
        raise ValueError(f"{word!r} is not a recompute word ('recompute', 'recompute-cheap', "
                         f"'recompute(k/n:a-b,c)', 'recompute-cheap(k/n:...)' or 'recompute(k/n:...)+cheap(j/n:...)')")
    n, on = int(found.group(2)), set()
    for piece in found.group(3).split(","):
        a, _, b = piece.partition("-")
        on.update(range(int(a), int(b or a) + 1))
    if max(on) >= n or len(on) != int(found.group(1)):
        raise ValueError(f"{word!r}: blocks {sorted(on)} are not {found.group(1)} of {n} blocks")
    return n, on


def recompute_mask(word: str) -> bool | tuple:
    """:attr:`Strategy.recompute` from its word (:attr:`Strategy.recompute_words`):
    ``True`` for every block (``"recompute-cheap"`` too: :attr:`Strategy.selective` says
    which level), else one level per block (``False``, ``"cheap"``, ``True``).

    >>> recompute_mask("recompute(3/4:0-1,3)"), recompute_mask("recompute"), recompute_mask("recompute-cheap")
    ((True, True, False, True), True, True)
    >>> recompute_mask("recompute-cheap(1/3:2)"), recompute_mask("recompute(1/3:0)+cheap(1/3:2)")
    ((False, False, 'cheap'), (True, False, 'cheap'))

    Raises
    ------
    ValueError
        Not a recompute word, a block past the count or at two levels, named.
    """
    if word in ("recompute", "recompute-cheap"):
        return True
    full, _, cheap = word.partition("+")
    if word.startswith("recompute-cheap("):
        n, on = _blocks_of(word, word, "recompute-cheap")
        return tuple("cheap" if i in on else False for i in range(n))
    n, on = _blocks_of(word, full, "recompute")
    levels = [True if i in on else False for i in range(n)]
    if cheap:
        n2, low = _blocks_of(word, cheap, "cheap")
        if n2 != n or on & low:
            raise ValueError(f"{word!r}: its two parts must name {n} blocks, none of them twice")
        levels = ["cheap" if i in low else x for i, x in enumerate(levels)]
    return tuple(levels)


@dataclass(frozen=True)
class Solved:
    """A plan with what it solved: ``plan`` places ``graph`` (the step, or
    the step transformed as ``strategy`` says); ``transformed`` is that
    transform (:class:`pesto.step.Transformed`: the split, the replication or
    both composed; its ``graph`` is ``graph``, its ``origin`` maps each op to
    the step's op, :meth:`origin_of`). Every realiser and the search keep it;
    for the plain step (``strategy.kind == "step"``) it defaults to the
    identity (:func:`pesto.step.identity`), else None means not kept. The
    same type for every kind; :func:`pesto.check_plan` and
    :func:`pesto.simulate` take it in place of a (graph, plan) pair.
    ``detail``: the realiser's own record, if any (a pipeline's
    :class:`~solver.parallel.pipelines.StepPlan`: its block order hints the
    slice model); not part of the result's meaning.

    Raises
    ------
    ValueError
        ``transformed.graph`` is not ``graph`` (other op names).

    Examples
    --------
    >>> from pesto.graph import Op, OpGraph
    >>> from pesto.step import split
    >>> g = OpGraph([Op("a", {"GPU": 4.0}, batch=True), Op("b", {"GPU": 1.0}, batch=False)])
    >>> s = split(g, 2)
    >>> r = Solved(None, s.graph, Strategy(micro_batches=2, schedule="free"), s)
    >>> r.origin_of("a@mb1").op, Solved(None, g).origin_of("b").role
    ('a', 'step')
    >>> Solved(None, g, Strategy(micro_batches=2, schedule="free"), s)
    Traceback (most recent call last):
    ...
    ValueError: Solved: the transform's graph 'graph@mb2' is not the graph placed 'graph' (other ops)
    """

    plan: Plan
    graph: OpGraph
    strategy: Strategy = Strategy()
    transformed: Transformed | None = None
    detail: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        t = self.transformed
        if t is None and self.graph is not None and self.strategy.kind == "step":
            object.__setattr__(self, "transformed", identity(self.graph))
        elif t is not None and t.graph is not self.graph and (self.graph is None
                                                               or t.graph.names != self.graph.names):
            raise ValueError(f"Solved: the transform's graph {t.graph.name!r} is not the graph placed "
                             f"{getattr(self.graph, 'name', None)!r} (other ops)")

    def origin_of(self, name: str) -> Origin:
        """The step's op (with its replica, slice and role) that op ``name`` of ``graph`` runs.

        Raises
        ------
        ValueError
            No transform was kept (a hand-made :class:`Solved` of a transformed step).
        KeyError
            ``name`` is not an op of ``graph``.
        """
        if self.transformed is None:
            raise ValueError(f"{self.strategy.name}: this result kept no transform (Solved.transformed is None)")
        try:
            return self.transformed.origin[name]
        except KeyError:
            raise KeyError(f"{name!r} is not an op of the graph placed ({self.graph.name!r})") from None

    @property
    def micro_batches(self) -> int:
        return self.strategy.micro_batches

    @property
    def replicas(self) -> int:
        return self.strategy.replicas

    @property
    def graph_kind(self) -> str:
        """``"step"``, ``"micro-batched"`` or ``"replicated"`` (:attr:`Strategy.kind`)."""
        return self.strategy.kind

    @property
    def steps(self) -> Mapping[str, float]:
        """Every candidate's step compared (``plan.log.steps``; empty for a plain solve)."""
        return dict(self.plan.log.steps) if self.plan.log is not None else {}
