"""Findings from trainkit's own records (the ``trainkit/*`` TensorBoard scalars of a run)."""
from __future__ import annotations

import datetime
from typing import Any, Callable, Dict, List, Optional

from ...recorder import (AMP_SKIPPED, COMPILE_RECOMPILES, COMPILE_SECONDS, DATA_WAIT,
                         GC_FULL, GC_MS, H2D_MS, H2D_PINNED_PCT, PREFIX, SAMPLES_PER_S, STEP_TIME,
                         UPDATE_MS)
from ..finding import Finding, severity_for
from ..runs import Run
from ..series import Series, argmax, fewest_holding, mean, median, positive, total
from .loaders import advice as loader_advice
from .optimizer_fix import _names, _optimizer_fix, _optimizers

#: The fix for pageable copies, whether the records or a trace found them.
PAGEABLE_FIX = ("DataLoader(..., pin_memory=True) and x = tk.to_device(x, 'cuda') (non_blocking "
                "when pinned), or x.pin_memory().to('cuda', non_blocking=True)")


class Steps:
    """The run's timed steps (the first is left out once there are a few: it pays for warm-up;
    so are steps that compiled, whose update and step time hold seconds of torch.compile, when
    others are left: TA105 reports recompiles).

    The steps, their times and each tag's values at them are numpy arrays
    (:mod:`trainkit.profiling.series`): a tag of a 1,000,000-step run read as a ``step -> value``
    dict took ~100 MB and ~0.1 s, and the rules read one per tag, TA101 its two again. The
    statistics taken of them are those the rules took of lists of floats.

    Example::

        st = Steps(run); st.share(DATA_WAIT)
    """

    def __init__(self, run: Run) -> None:
        import numpy as np

        self.run = run
        # per tag, its points and its values at the timed steps: the rules and the breakdown ask
        # for the same few tags again and again (data wait 5 times)
        self._series: Dict[str, Series] = {}
        self._at: Dict[str, Any] = {}
        self._sums: Dict[str, float] = {}
        times = self.series(STEP_TIME)
        steps, values = times.steps, times.values  # views of the run's points, where they can
        timed = values > 0
        if not timed.all():
            steps, values = steps[timed], values[timed]
        #: how many steps have a step time (the steps below are those less the ones left out)
        self.timed = len(steps)
        compiled = self.series(COMPILE_SECONDS).steps
        if len(compiled):
            kept = ~np.isin(steps, compiled)
            if kept.any() and not kept.all():
                steps, values = steps[kept], values[kept]
        first = 1 if len(steps) > 3 else 0
        #: the timed steps left out: ``{"first": 0 or 1, "compiled": n}`` (the tab says them)
        self.left_out = {"first": first, "compiled": self.timed - len(steps)}
        #: the timed steps, increasing (an int64 numpy array)
        self.steps = steps[first:]
        #: their step times (ms; a float64 numpy array)
        self.times = values[first:]
        self.total_ms = total(self.times)

    def __len__(self) -> int:
        return len(self.steps)

    def series(self, tag: str) -> Series:
        """The tag's ``step -> value`` (:meth:`.runs.Run.series`), read once."""
        got = self._series.get(tag)
        if got is None:
            got = self._series[tag] = self.run.series(tag)
        return got

    def at(self, tag: str) -> Any:
        """The tag's value at each timed step (0 where it was not recorded), a float64 numpy
        array; the same one for the same tag, not to be changed."""
        got = self._at.get(tag)
        if got is None:
            got = self._at[tag] = self.series(tag).at(self.steps)
        return got

    def sum(self, tag: str) -> float:
        """Sum of the tag over the timed steps (in step order)."""
        got = self._sums.get(tag)
        if got is None:
            got = self._sums[tag] = total(self.at(tag))
        return got

    def share(self, tag: str) -> float:
        """Sum of the tag over the timed steps, as a fraction of their total time."""
        return self.sum(tag) / self.total_ms if self.total_ms > 0 else 0.0

    def median_ms(self) -> float:
        return median(self.times)

    def describe(self, tag: str) -> str:
        per = self.at(tag)
        n = len(per)
        on = positive(per)
        whole = self.sum(tag)
        part = median(per) if on == n else 0.0
        if on == n and part * n >= whole / 2:
            return (f"median {part:.2f} ms of a median {self.median_ms():.2f} ms step, "
                    f"over {len(self)} steps")
        # Recorded on some steps only (a batch feeding several steps: a GAN's critic stepping
        # twice per batch has the batch's wait on every other step), or most of it on a few
        # steps (a stall: workers started again each epoch): medians would say 0 ms of a step
        # whichever share it takes, so the means, whose ratio is the share.
        said = (f"{whole / n:.2f} ms of a {self.total_ms / n:.2f} ms step on average, over "
                f"{n} steps")
        if on < n:
            return f"{said}; recorded on {on} of them"
        longest = argmax(per)
        k = fewest_holding(per, whole / 2)  # the fewest steps that hold half of it
        return (f"{said}; half of it on {k} of them, the longest {float(per[longest]):.2f} ms "
                f"(step {int(self.steps[longest])})")


def data_loader_bound(st: Steps) -> Optional[Finding]:
    share = st.share(DATA_WAIT)
    if share < 0.10:
        return None
    more, fix = loader_advice(st)  # fitted to the DataLoader's recorded settings, if any
    return Finding(
        code="TA101", title="data-loader bound",
        evidence=f"waiting for the next batch takes {share:.0%} of step time "
                 f"({st.describe(DATA_WAIT)}); the device idles meanwhile{more}",
        share=share, count=positive(st.at(DATA_WAIT)),
        fix=fix, severity=severity_for(share))


def pageable_copies(st: Steps) -> Optional[Finding]:
    pinned = st.series(H2D_PINNED_PCT).values
    if not len(pinned):
        return None
    pct = mean(pinned)
    if pct >= 90.0:
        return None
    share = st.share(H2D_MS)
    return Finding(
        code="TA102", title="pageable host-to-device copies",
        evidence=f"{100 - pct:.0f}% of the bytes copied to the device came from pageable memory "
                 f"(not pinned): such copies are staged by the driver and cannot overlap compute; "
                 f"copies take {share:.0%} of step time",
        share=share, count=int((pinned < 90.0).sum()),
        fix=PAGEABLE_FIX, severity=severity_for(share, high=0.2, medium=0.05))


def optimizer_dominates(st: Steps) -> Optional[Finding]:
    share = st.share(UPDATE_MS)
    # Below ~0.2 ms per update every part of the step is overhead; a share says nothing there.
    if share < 0.30 or median(st.at(UPDATE_MS)) < 0.2:
        return None
    return Finding(
        code="TA104", title="optimizer step dominates",
        evidence=f"optimizer.step() takes {share:.0%} of step time ({st.describe(UPDATE_MS)})",
        share=share, count=len(st), fix=_optimizer_fix(st),
        severity=severity_for(share, high=0.5, medium=0.3))


def recompiles(st: Steps) -> Optional[Finding]:
    values = st.series(COMPILE_RECOMPILES).values
    n = int(values.max()) if len(values) else 0
    if n <= 0:
        return None
    return Finding(
        code="TA105", title="torch.compile recompiles",
        evidence=f"{n} recompilation(s) recorded (trainkit/compile/recompiles); each one stalls "
                 f"training while the graph is compiled again",
        share=None, count=n,
        fix="keep shapes and Python values the graph depends on stable (pad batches, "
            "drop_last=True, dynamic=True for varying shapes), keep LR/betas as tensors, or use "
            "tk.compiled_step, which does not recompile under LR schedulers; "
            "TORCH_LOGS=recompiles shows why",
        severity="high" if n >= 3 else "medium")


#: steps with a collection in them before TA106 is a pattern
GC_RECURS = 3


def gc_per_step(st: Steps) -> Optional[Finding]:
    n = len(st)
    with_full = positive(st.at(GC_FULL))
    with_gc = positive(st.at(GC_MS))
    share = st.share(GC_MS)
    # A collection or two in a run is the interpreter's own thresholds met by chance (one full
    # collection of a large heap can outweigh a short run of small steps), not a pattern to fix.
    if with_gc < GC_RECURS or (with_full < 0.5 * n and share < 0.05):
        return None
    # Say how often: "every step" only when it was (a gc.collect() every 10th step costs as much
    # and wants the same fix, but is not the same thing).
    when = "every step" if with_gc == n else f"in {with_gc} of {n} steps"
    # The hook cannot tell a gc.collect() from the interpreter's own collections, which a loop
    # making many Python objects a step triggers, in full too: both are said where they can be.
    if with_full >= 0.5 * n:
        what = (f"a full garbage collection runs in {with_full} of {n} steps (a gc.collect() in "
                f"the loop, or the interpreter's own, of objects the loop keeps making?)")
    else:
        what = (f"garbage collections run in {with_gc} of {n} steps, full (generation 2) ones in "
                f"{with_full} (" + ("gc.collect() every few steps, or the interpreter's own?)"
                                    if with_full else "the interpreter's own: a gc.collect() "
                                                      "is a full one)"))
    own = ("the interpreter collects on its own when the step makes many Python objects "
           "(per-sample records, lists or dicts kept a while): keep per-step data in tensors, "
           "call gc.freeze() after setup, or gc.disable() with a gc.collect() every few hundred "
           "steps")
    return Finding(
        code="TA106", title=f"garbage collection {when}",
        evidence=f"{what}; collections take {share:.0%} of step time",
        share=share, count=with_gc,
        fix=(f"remove any gc.collect() (and torch.cuda.empty_cache()) from the step; {own}"
             if with_full else own),
        severity=severity_for(share, high=0.2, medium=0.05))


RULES: List[Callable[[Steps], Optional[Finding]]] = [
    data_loader_bound, pageable_copies, optimizer_dominates, recompiles, gc_per_step,
]


def no_steps(run: Run) -> Finding:
    """TA110: the run has records but fewer than two counted steps, so no step time.

    The usual cause is a loop trainkit cannot see: no patched optimizer and no patched loader
    (a session alone samples memory and CPU load, and that is all it records).
    """
    seen = ("only 1 step was" if run.scalars.get(UPDATE_MS) or run.scalars.get(DATA_WAIT)
            else "no step was")
    counts = run.series(AMP_SKIPPED).values  # a running count
    skipped = int(counts.max()) if len(counts) else 0
    if skipped:  # the optimizer is patched and was called: the GradScaler skipped its steps
        return Finding(
            code="TA110", title="no steps recorded",
            evidence=f"{seen} counted in {run.path!r}: the GradScaler skipped {skipped} "
                     f"optimizer step(s) for inf/nan gradients (trainkit/amp/skipped_steps), "
                     f"and a skipped step is no step",
            share=None, count=0,
            fix="find where the gradients overflow: with fp16, a GradScaler init_scale too high "
                "for the model (it halves per skipped step), or dtype='bf16'; else inf/nan in the "
                "loss itself (a learning rate too high, log(0), bad inputs)",
            severity="high", run=run.name)
    unstepped = _patched_never_stepped(run)
    if unstepped:  # patched, and the loop never reached its step()
        return Finding(
            code="TA110", title="no steps recorded",
            evidence=f"{seen} counted in {run.path!r}: the patched {unstepped} never stepped in "
                     f"the session (trainkit/meta/optimizers), so the loop did not reach "
                     f"optimizer.step(), and step time (trainkit/step_time_ms, the time between "
                     f"two counted steps) has nothing to measure",
            share=None, count=0,
            fix="check the condition the step runs under: a loop that learns once a replay buffer "
                "is warm, or every n batches, may never get there in a short run; run longer or "
                "lower the threshold. For an evaluation or inference run, patch the loader (each "
                "batch is then a step)",
            severity="high", run=run.name)
    return Finding(
        code="TA110", title="no steps recorded",
        evidence=f"{seen} counted in {run.path!r} and no trace holds a profiled step: step time "
                 f"(trainkit/step_time_ms) is the time between two counted steps, so nothing can "
                 f"be said about where it goes (is the optimizer patched?)",
        share=None, count=0,
        fix="let the session count the steps: tk.patch(optimizer) before the loop (each "
            "optimizer.step() is a step), or for batch in tk.patch(loader) (each batch is a step "
            "when no optimizer steps), inside `with tk.session(...)`",
        severity="high", run=run.name)


def _patched_never_stepped(run: Run) -> str:
    """The patched optimizers (``"Adam"``, ``"Adam and SGD"``) when none stepped in the session
    shown, as its close recorded them; "" when none was patched, one stepped, or not recorded."""
    got = _optimizers(run)
    if not got or any(o.get("stepped") is not False for o in got):
        return ""
    return _names(tuple(sorted({str(o.get("type", "optimizer")) for o in got})))


def several_sessions(run: Run) -> Optional[Finding]:
    """TA111: a session wrote into the run's folder again from step 1 (or from before the first
    step of another): TensorBoard shows only the later one, and so only it is analyzed.

    Said only where a hidden session counted steps (``Run.hidden_counted``): the steps a user
    would miss in the findings. A session that counted none (a relaunch that crashed in setup or
    in its first step) is hidden from the analysis wherever another counted steps, and leaves no
    step out: no finding, and not counted among the earlier sessions left out.

    A session resumed with ``tk.session(..., steps_done=N)`` continues the run: no finding.
    """
    if not run.hidden_counted:
        return None
    n, shown = len(run.hidden_counted), [f for f in run.sessions if f not in run.hidden]
    idle = len(run.hidden) - n  # relaunches that counted no step, before or after
    also = (f" (so is {idle} session(s) that counted no step, a relaunch that crashed before "
            f"its first one)" if idle else "")
    when = ("" if run.started is None else " started "
            + datetime.datetime.fromtimestamp(run.started).strftime("%Y-%m-%d %H:%M:%S"))
    traces = f" and {len(run.traces)} trace(s)" if run.traces else ""
    left = f" and {len(run.earlier_traces)} trace(s)" if run.earlier_traces else ""
    return Finding(
        code="TA111", title="several sessions in one run folder",
        evidence=f"{len(run.sessions)} sessions wrote into {run.path!r}, and a later one counted "
                 f"its steps again from the first step of an earlier one or before (a script run "
                 f"again with the same logdir, from step 1, or a torchrun restart after a "
                 f"failure, --max-restarts): these "
                 f"findings are of the session(s) TensorBoard shows, {', '.join(shown)}{when}"
                 f"{traces}; the {n} earlier one(s){left} are left out{also}, as TensorBoard's "
                 f"Scalars tab leaves them out (with --load_fast=false, it draws all of them one "
                 f"after the other)",
        share=None, count=len(run.sessions),
        fix="give each run its own folder: tk.session(logdir='runs/exp2'), or tk.session() "
            "for a new dated one under runs/; a run resumed from a checkpoint goes on in the "
            "same folder with tk.session(logdir, steps_done=<the checkpoint's step count>), a "
            "torchrun restart too (or, with tk.session() and no logdir, each restart writes a "
            "folder of its own, <run>-restart<K>); to "
            "compare with an earlier session, move its event file (and its traces) into a "
            "folder of its own beside this one",
        severity="low", run=run.name)


def items_per_step(run: Run) -> Optional[float]:
    """The median items (samples) per step, from throughput and step time, or None."""
    rates, times = run.series(SAMPLES_PER_S), run.series(STEP_TIME)
    i, found = times.find(rates.steps)  # the steps holding both
    items = rates.values[found] * times.values[i[found]] / 1e3
    return median(items) if len(items) else None


def findings(st: Steps) -> List[Finding]:
    """Every rule over one run's timed steps."""
    if len(st) == 0:
        return []
    out = []
    for rule in RULES:
        f = rule(st)
        if f is not None:
            out.append(f)
    return out


def breakdown(st: Steps) -> Dict[str, float]:
    """Mean ms per step of the run's timed steps: data wait, h2d, forward, backward, optimizer,
    other, and the total; and the median step (``median_step``: what ``trainkit demo``'s
    summary says, which a few slow steps, an evaluation's, do not pull up as they do the mean)."""
    if len(st) == 0:
        return {}
    parts = {"data_wait": DATA_WAIT, "h2d": H2D_MS, "forward": PREFIX + "region/forward_ms",
             "backward": PREFIX + "region/backward_ms", "optimizer": UPDATE_MS}
    out = {name: st.sum(tag) / len(st) for name, tag in parts.items()}
    step = st.total_ms / len(st)
    out["other"] = max(0.0, step - sum(out.values()))
    out["step"] = step
    out["median_step"] = float(st.median_ms())
    return out
