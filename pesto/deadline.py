"""One clock for a whole solve: the time left, and whether the user stopped it.

Every pass of ``pesto.solve`` reads the same :class:`Deadline` instead of a
private time limit, so ``time_limit`` bounds the solve end to end, and an
interrupt (Ctrl-C, ``SIGTERM``) ends every pass at its next check rather than
only the one running.

* :meth:`Deadline.left` / :meth:`Deadline.expired` / :meth:`Deadline.budget`
  -- what a pass may still spend;
* :meth:`Deadline.interrupt` -- stop: ``expired()`` turns true and the
  registered stoppers (e.g. a running CP-SAT search's ``stop_search``) are
  called;
* :meth:`Deadline.catching_signals` -- while a solve runs, the first SIGINT,
  SIGTERM or SIGHUP interrupts it (the solve returns its best plan with status
  ``interrupted``); a second SIGINT raises :class:`KeyboardInterrupt` at once;
* :meth:`Deadline.stopping` -- register a stopper for the duration of a call
  that cannot look at the clock itself (a C++ search);
* :meth:`Deadline.check` -- raise :class:`Stopped` once expired: a long
  loop (a heuristic, a search) calls it every :data:`CHECK_EVERY` steps, so an
  interrupt ends it within a fraction of a second and a pass that would
  overrun the limit gives up;
* :meth:`Deadline.charge` -- with ``deterministic=True`` the clock is a
  :class:`WorkClock` that moves only by the work passes report (CP-SAT's
  deterministic time, a fixed cost per simulated move), so the same input
  gives the same plan on a busy or an idle machine; with the wall clock,
  charging does nothing. A deterministic solve still has a wall-clock
  safety net (:func:`wall_net`: ten times its limit plus
  :data:`WALL_NET_SECONDS`): past it the solve ends as at its limit, with
  its best plan and the reason :data:`WALL_NET_REASON` (``plan.log.stopped``:
  no longer reproducible), rather than run on for a quarter of an hour on
  a loaded machine.

Examples
--------
>>> d = Deadline(10.0)
>>> 9.0 < d.left() <= 10.0, d.expired()
(True, False)
>>> d.budget(3.0) == 3.0
True
>>> stopped = []
>>> with d.stopping(lambda: stopped.append(True)):
...     d.interrupt("SIGINT")
>>> d.expired(), d.reason, stopped
(True, 'SIGINT', [True])
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from typing import Callable, Iterator

from .errors import PestoError

__all__ = ["Deadline", "WorkClock", "Stopped", "REPLAY_COST_PER_OP", "CHECK_EVERY", "wall_net",
           "WALL_NET_FACTOR", "WALL_NET_SECONDS", "WALL_NET_REASON"]

#: Work charged per op for one replay of a plan in deterministic mode (seconds;
#: about what the compiled engine takes, so charged time tracks wall time).
REPLAY_COST_PER_OP = 2e-7
#: Steps (ops placed, moves tried) between two :meth:`Deadline.check` calls in
#: a long loop: ~1 ms of work at the slowest loops, a clock read is ~50 ns.
CHECK_EVERY = 1024
#: A deterministic budget's wall-clock safety net: this many times the budget ...
WALL_NET_FACTOR = 10.0
#: ... plus this many seconds (:func:`wall_net`).
WALL_NET_SECONDS = 30.0
#: The reason a deterministic solve stopped by its wall-clock net gives (``plan.log.stopped``).
WALL_NET_REASON = "wall-time net (deterministic limit not reached: not reproducible)"


def wall_net(seconds: float) -> float:
    """The wall seconds a deterministic budget of ``seconds`` may take at most
    (the whole solve's, and each CP-SAT search's own ``max_time_in_seconds``).

    >>> wall_net(60)
    630.0
    """
    return WALL_NET_FACTOR * float(seconds) + WALL_NET_SECONDS


#: Signals that stop a solve with its best plan: Ctrl-C, ``kill``, and the
#: terminal closing (SIGHUP, where the platform has it).
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class Stopped(PestoError):
    """A pass gave up before its result because the deadline passed or the
    solve was interrupted (``reason``: "time limit", "SIGINT", ...); the
    recipe keeps the plans it had.

    >>> d = Deadline(0.0)
    >>> try:
    ...     d.check()
    ... except Stopped as exc:
    ...     print(exc.reason)
    time limit
    """

    def __init__(self, reason: str = "time limit"):
        self.reason = reason
        super().__init__(reason)


class WorkClock:
    """A clock that moves only when work is charged to it (deterministic mode).

    >>> c = WorkClock(); c.advance(1.5); c()
    1.5
    """

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, float(seconds))


class Deadline:
    """Seconds from now until a solve must end (``None``: no limit).

    Parameters
    ----------
    seconds : float or None
        The limit; ``math.inf`` or None for none.
    clock : callable, optional
        Seconds as a float (default ``time.perf_counter``; tests pass a fake clock).
    deterministic : bool
        Use a :class:`WorkClock`: time passes only by :meth:`charge`.
    start : float, optional
        When the time started on ``clock`` (default now): a solve counts from
        the user's call, pre-checks included. Ignored with ``deterministic``.
    wall : callable, optional
        The wall clock of the deterministic safety net (default
        ``time.perf_counter``; tests pass a fake one): with a
        :class:`WorkClock`, once it has run :func:`wall_net` of ``seconds``
        the deadline is expired (:meth:`net_passed`).

    >>> now = [0.0]
    >>> d = Deadline(1.0, deterministic=True, wall=lambda: now[0])
    >>> d.expired(); now[0] = 41.0; d.expired(), d.reason, d.interrupted
    False
    (True, 'wall-time net (deterministic limit not reached: not reproducible)', False)
    """

    def __init__(self, seconds: float | None, *, clock: Callable[[], float] | None = None,
                 deterministic: bool = False, start: float | None = None,
                 wall: Callable[[], float] = time.perf_counter):
        if clock is None:
            clock = WorkClock() if deterministic else time.perf_counter
        self.clock = clock
        self.t0 = clock() if start is None or isinstance(clock, WorkClock) else min(float(start), clock())
        self.seconds = math.inf if seconds is None else float(seconds)
        self._wall, self._wall0 = wall, wall()
        self._net = wall_net(self.seconds) if isinstance(clock, WorkClock) else math.inf
        self._net_hit = False
        self._reason: str | None = None  # why it ended early: "SIGINT", "SIGTERM", ...
        self._root = self  # a pass's deadline shares its solve's interrupts (sub)
        self._stoppers: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def sub(self, seconds: float) -> "Deadline":
        """A pass's deadline: ``seconds`` or what is left, whichever ends
        first, on the same clock; interrupting the solve interrupts it.

        >>> d = Deadline(10.0); s = d.sub(3.0)
        >>> s.left() <= 3.0, d.interrupt("SIGINT"), s.expired(), s.reason
        (True, None, True, 'SIGINT')
        """
        child = Deadline(min(float(seconds), self.left()), clock=self.clock)
        child._root = self._root
        return child

    def interrupts_only(self) -> "Deadline":
        """A deadline without a time limit that ends when this solve is
        interrupted (what the first heuristic runs under: it must finish,
        since its plan is what any later stop returns, but Ctrl-C stops it).

        >>> d = Deadline(0.0); f = d.interrupts_only()
        >>> f.expired(), d.interrupt("SIGINT"), f.expired()
        (False, None, True)
        """
        child = Deadline(None, clock=self.clock)
        child._root = self._root
        return child

    @property
    def reason(self) -> str | None:
        """Why the solve was stopped early (an interrupt's, or the wall net's), or None."""
        root = self._root
        return root._reason or (WALL_NET_REASON if root._net_hit else None)

    def __repr__(self) -> str:
        return f"Deadline({self.seconds:g} s, {self.left():.2f} s left{', ' + self.reason if self.reason else ''})"

    @property
    def deterministic(self) -> bool:
        """True when time is work charged (:class:`WorkClock`), not the wall clock."""
        return isinstance(self.clock, WorkClock)

    def charge(self, seconds: float) -> None:
        """Report ``seconds`` of (deterministic) work; moves a :class:`WorkClock` only."""
        if isinstance(self.clock, WorkClock):
            self.clock.advance(seconds)

    @property
    def interrupted(self) -> bool:
        """True once :meth:`interrupt` was called."""
        return self._root._reason is not None

    def net_passed(self) -> bool:
        """True once a deterministic deadline's wall-clock net passed (module
        doc): from then on it is expired, :attr:`reason` is
        :data:`WALL_NET_REASON`, and the stoppers have run (a running CP-SAT
        search polls this). Not an interrupt: the solve ends as at its limit."""
        root = self._root
        if root._net_hit or root._net == math.inf or root._wall() - root._wall0 <= root._net:
            return root._net_hit
        with root._lock:
            root._net_hit = True
            stoppers = list(root._stoppers)
        for stop in stoppers:
            stop()
        return True

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def left(self) -> float:
        """Seconds left (0 once interrupted; never negative)."""
        if self.interrupted or (self.seconds < math.inf and self.net_passed()):
            return 0.0   # (a deadline without a limit, as :meth:`interrupts_only`'s, ends on interrupts only)
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        return self.left() <= 0.0

    def check(self) -> None:
        """Raise :class:`Stopped` if the deadline passed or the solve was interrupted."""
        if self.expired():
            raise Stopped(self.reason or "time limit")

    def budget(self, seconds: float) -> float:
        """What a pass that wants ``seconds`` may spend: ``min(seconds, left())``."""
        return max(0.0, min(float(seconds), self.left()))

    def interrupt(self, reason: str = "interrupted") -> None:
        """End the solve early: ``expired()`` turns true, the stoppers run
        (the first call only; its ``reason`` stays)."""
        root = self._root
        with root._lock:
            if root._reason is not None or root._net_hit:  # the stoppers ran already
                return
            root._reason = reason
            stoppers = list(root._stoppers)
        for stop in stoppers:
            stop()

    @contextlib.contextmanager
    def stopping(self, stop: Callable[[], None]) -> Iterator[None]:
        """Call ``stop()`` if the deadline is interrupted while inside (at once
        if it already is)."""
        root = self._root
        with root._lock:
            root._stoppers.append(stop)
        try:
            if self.interrupted or root._net_hit:
                stop()
            yield
        finally:
            with root._lock:
                root._stoppers.remove(stop)

    @contextlib.contextmanager
    def catching_signals(self) -> Iterator[None]:
        """Turn the first SIGINT / SIGTERM / SIGHUP (the terminal closed) into
        :meth:`interrupt`; a second
        SIGINT raises :class:`KeyboardInterrupt`. Only in the main thread
        (elsewhere Python cannot install handlers, and this does nothing);
        the previous handlers come back on exit. A signal the process ignores
        (``nohup``, or a job a script started with ``&``, whose shell ignores
        Ctrl-C for it) stays ignored: the caller chose not to be stopped by it."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum, frame):
            name = signal.Signals(signum).name
            if self.interrupted and signum == signal.SIGINT:
                raise KeyboardInterrupt  # the second Ctrl-C: abort now
            self.interrupt(name)

        saved = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS
                 if signal.getsignal(s) is not signal.SIG_IGN}
        try:
            yield
        finally:
            for s, h in saved.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
