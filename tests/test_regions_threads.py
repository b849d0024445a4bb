"""A region name entered by several threads at once: each thread's entries are timed on their own.

With one stack of start times per name, shared by every thread, thread A entering "x" at t0,
thread B entering it at t1, A leaving at t2 and B at t3 wrote one record, t3 - t0 (A's exit took
B's start and, nested, recorded nothing; B's took A's), where A spent t2 - t0 and B t3 - t1.
Real threads forced into that order by ``threading.Event`` handshakes, a real session, the
values read back from its event files: the C regions and the pure-Python ones (fixture
``region_impl``), the full region while a profiler records, ``contextlib.ExitStack``, and an
entry nested in one of its name in the same thread, still counted once.

Each test ends step 1 inside the first thread's entry and has the second thread enter after it,
so each thread's record lands under a step of its own (regions go under a step by their start):
step 1 holds the first thread's time, step 2 the second's. A record must lie between the time of
the body inside the region and the wall around the ``with`` (the other threads, the session's
writer or the profiler's, may hold the GIL for a switch interval, 5 ms, on either side).
"""
from __future__ import annotations

import contextlib
import threading
import time
from itertools import permutations
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import mlp
from tests.test_audit_regions_nested import region_impl  # noqa: F401 (fixture: C and Python)

PAUSE = 0.03  # s: what each thread spends in the region while the other is in it too
WAIT = 10  # s: a handshake not met in this long is a failure, not a hang


class _Loop:
    """A patched optimizer stepping a small model: each ``step()`` ends one trainkit step."""

    def __init__(self) -> None:
        self.model = mlp()
        self.opt = tk.patch(torch.optim.SGD(self.model.parameters(), lr=0.1))

    def step(self) -> None:
        self.model(torch.randn(4, 8)).sum().backward()
        self.opt.step()
        self.opt.zero_grad()


class _Worker(threading.Thread):
    """A thread running ``body``; what it raised is raised again by :meth:`finish`."""

    def __init__(self, body: Callable[[], None], name: Optional[str] = None) -> None:
        super().__init__(daemon=True, name=name)
        self.body, self.error = body, None

    def run(self) -> None:
        try:
            self.body()
        except BaseException as exc:  # noqa: BLE001 (handed to the test's thread)
            self.error = exc

    def finish(self) -> None:
        self.join(WAIT)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error


def _region_ms(logdir, name: str = "x") -> Dict[int, float]:
    return dict(scalars(logdir)[f"trainkit/region/{name}_ms"])


def _interleaved(loop: _Loop, run: Callable[[Callable[[], None]], None],
                 run_second: Optional[Callable[[Callable[[], None]], None]] = None,
                 first_in_a_thread: bool = False) -> List[Tuple[float, float]]:
    """``run(body)`` runs ``body`` inside the region (``with region: body()``, or a decorated
    function calling it). This thread (another one, if ``first_in_a_thread``) enters at t0 and
    ends step 1; a second thread enters at t1 (through ``run_second``, if given); the first exits
    at t2, the second at t3. Returns, for each thread, the ms of its body (inside the region)
    and of its ``run`` (around it): its record, t2 - t0 or t3 - t1, lies between the two."""
    b_in, a_out = threading.Event(), threading.Event()
    spans: Dict[str, Tuple[float, float]] = {}

    def first() -> None:
        loop.step()  # step 1 ends inside this entry: it goes under step 1 by its start
        b.start()  # ... and the second thread's under step 2
        assert b_in.wait(WAIT)
        time.sleep(PAUSE)

    def second() -> None:
        b_in.set()
        assert a_out.wait(WAIT)
        time.sleep(PAUSE)

    def timed(key: str, run: Callable[[Callable[[], None]], None],
              body: Callable[[], None]) -> None:
        inner: List[float] = []

        def timed_body() -> None:
            t = time.perf_counter()
            body()
            inner.append((time.perf_counter() - t) * 1e3)

        t = time.perf_counter()
        run(timed_body)
        spans[key] = (inner[0], (time.perf_counter() - t) * 1e3)

    b = _Worker(lambda: timed("b", run_second or run, second))
    try:
        if first_in_a_thread:
            a = _Worker(lambda: timed("a", run, first))
            a.start()
            a.finish()
        else:
            timed("a", run, first)
    finally:
        a_out.set()
        b.finish()
    loop.step()  # ends step 2
    return [spans["a"], spans["b"]]


def _with(cm: Any) -> Callable[[Callable[[], None]], None]:
    """``run`` for :func:`_interleaved`: the body inside ``with cm``."""

    def run(body: Callable[[], None]) -> None:
        with cm:
            body()

    return run


def _within(ms: float, span: Tuple[float, float], slack: float = 1e-3) -> bool:
    """``ms`` between a body's time and the wall around its region (``slack`` ms: the event
    file's float32, the profiler's microseconds)."""
    return span[0] - slack <= ms <= span[1] + slack


def _check(logdir, spans: List[Tuple[float, float]]) -> None:
    got = _region_ms(logdir)
    assert sorted(got) == [1, 2]  # one spanning record under step 1 (t3 - t0) before
    for step, span in zip((1, 2), spans):
        assert _within(got[step], span), (step, got[step], span)


def test_two_threads_in_one_name_are_timed_each_on_its_own(tmp_path, region_impl):
    loop = _Loop()
    with tk.session(logdir=tmp_path, system_metrics=False):
        region = tk.profile_region("x")  # made here: this thread's entries are the fast ones
        spans = _interleaved(loop, _with(region))
    _check(tmp_path, spans)


def test_a_decorated_function_called_from_two_threads(tmp_path, region_impl):
    # A prefetch thread calling the decorated function while the loop calls it too.
    loop = _Loop()

    @tk.profile_region("x")
    def work(body: Callable[[], None]) -> None:
        body()

    with tk.session(logdir=tmp_path, system_metrics=False):
        spans = _interleaved(loop, work)
    _check(tmp_path, spans)


@pytest.mark.parametrize("maker", ["this thread", "a thread gone since"])
def test_two_threads_other_than_the_one_that_made_the_region(tmp_path, region_impl, maker):
    # Neither thread made the region: with this thread as its maker, both are on stacks of their
    # own; with a thread gone since, the first may get that thread's ident again (idents are
    # reused) and so its fast entry and exit, the second a stack of its own. Right either way.
    loop = _Loop()
    made: List[Any] = []
    with tk.session(logdir=tmp_path, system_metrics=False):
        if maker == "this thread":
            made.append(tk.profile_region("x"))
        else:
            maker_thread = _Worker(lambda: made.append(tk.profile_region("x")))
            maker_thread.start()
            maker_thread.finish()
        spans = _interleaved(loop, _with(made[0]), first_in_a_thread=True)
    _check(tmp_path, spans)


def test_an_entry_nested_in_its_name_in_one_thread_still_records_once(tmp_path, region_impl):
    # The second thread enters twice, one inside the other: its outermost entry alone records,
    # while the first thread's entry is open too (their entries were on one stack before).
    loop = _Loop()
    with tk.session(logdir=tmp_path, system_metrics=False):
        region = tk.profile_region("x")
        run = _with(region)
        spans = _interleaved(loop, run, run_second=lambda body: run(lambda: run(body)))
    _check(tmp_path, spans)


def test_exit_stack_in_two_threads(tmp_path, region_impl):
    # contextlib.ExitStack enters through the type: type(cm).__enter__(cm), and the same exit.
    loop = _Loop()

    with tk.session(logdir=tmp_path, system_metrics=False):
        region = tk.profile_region("x")

        def run(body: Callable[[], None]) -> None:
            with contextlib.ExitStack() as stack:
                stack.enter_context(region)
                body()

        spans = _interleaved(loop, run)
    _check(tmp_path, spans)


def test_the_full_region_while_a_profiler_records(tmp_path, region_impl):
    # Both threads enter the full region: a record_function range each, closed in its thread.
    loop = _Loop()
    try:  # the trace holds the second thread's range too (else only the starting thread's)
        every_thread = {"experimental_config":
                        torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except (AttributeError, TypeError):  # an older torch
        every_thread = {}
    with tk.session(logdir=tmp_path, system_metrics=False):
        region = tk.profile_region("x")  # the fast region, made before the profiler starts
        with profile(activities=[ProfilerActivity.CPU], **every_thread) as prof:
            spans = _interleaved(loop, _with(region))
    _check(tmp_path, spans)
    if every_thread:
        ranges = {e.thread: e.time_range.elapsed_us() / 1e3 for e in prof.events()
                  if e.name == "x"}
        assert len(ranges) == 2  # one range a thread, each its own thread's time
        assert any(all(_within(ms, span, slack=0.05) for ms, span in zip(ranges.values(), order))
                   for order in permutations(spans)), (ranges, spans)


def test_a_thread_exiting_a_name_it_has_not_entered(tmp_path, region_impl):
    # An exit with no entry of its own is the IndexError of an unmatched exit, as in one
    # thread; it took another thread's open entry before (and that one's exit then failed).
    loop = _Loop()
    with tk.session(logdir=tmp_path, system_metrics=False):
        region = tk.profile_region("x")

        def stray_exit(open_in: Optional[str]) -> Callable[[], None]:
            def body() -> None:
                with pytest.raises(IndexError) as raised:
                    type(region).__exit__(region, None, None, None)
                said = str(raised.value)
                assert said.startswith("profile_region('x'): exited in thread 'stray'"), said
                assert ("open in thread" in said) == (open_in is not None), said
                assert open_in is None or f"open in thread {open_in!r}" in said, said
            return body

        stray = _Worker(stray_exit(None), name="stray")
        stray.start()
        stray.finish()  # nothing open anywhere
        t = time.perf_counter()
        with region:
            t_in = time.perf_counter()
            stray = _Worker(stray_exit(threading.current_thread().name), name="stray")
            stray.start()
            stray.finish()  # this thread's entry open
            time.sleep(PAUSE)
            inner = (time.perf_counter() - t_in) * 1e3
        wall = (time.perf_counter() - t) * 1e3
        loop.step()
    got = _region_ms(tmp_path)
    assert sorted(got) == [1] and _within(got[1], (inner, wall)), (got, inner, wall)


def test_an_unmatched_exit_in_the_loop_names_its_region(tmp_path, region_impl):
    # The C exit said "pop from empty list", the Python one too: no word of which region.
    with tk.session(logdir=tmp_path, system_metrics=False):
        region = tk.profile_region("fwd")
        with pytest.raises(IndexError, match=r"^profile_region\('fwd'\): exited in thread "
                                             r"'MainThread', which has no open entry"):
            type(region).__exit__(region, None, None, None)
        with region:  # still timed as before
            pass
        _Loop().step()
    assert sorted(_region_ms(tmp_path, "fwd")) == [1]


def test_a_with_around_a_yield_resumed_in_another_thread_says_the_fix(tmp_path, region_impl):
    # The generator's `with` entered in this thread exits in the worker's: the error says where
    # it is open and that the decorated generator function times each resumption instead.
    def made() -> Any:
        with tk.profile_region("x"):
            yield 1

    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.profile_region("x")  # this thread's, as the loop's
        gen = made()
        next(gen)
        worker = _Worker(lambda: next(gen, None), name="prefetch")
        worker.start()
        with pytest.raises(IndexError) as raised:
            worker.finish()
    said = str(raised.value)
    assert said.startswith("profile_region('x'): exited in thread 'prefetch'"), said
    assert "open in thread 'MainThread'" in said and "@tk.profile_region('x')" in said, said
