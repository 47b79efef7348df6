"""The plan space of a training step beyond one placement of the step as given.

A :class:`~solver.parallel.strategy.Strategy` says how a step is run
(replicas, pipeline stages, micro-batches, schedule); a plan of it places a
transformed step, so every result is a :class:`~solver.parallel.strategy.Solved`
(the plan, the graph it places, the strategy). :mod:`solver.parallel.search`
is the one search over strategies under the solve's one clock.
"""
