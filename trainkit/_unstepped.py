"""A session that counted no step: what went under its one step, and what to say about it.

With nothing counting steps (no patched optimizer stepped, no patched loader's batch counted as
a step), every value logged without ``step=`` (and every region) goes under the session's first
step. A loop of 1,000 ``s.log("loss", loss)`` calls then shows in TensorBoard as one point (their
mean), or a few at one step (the means of what each flush found), and nothing said why. The
recorder tallies the values of that step (:func:`tally`, :func:`add`) and the session says so at
its close (:func:`message`).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Sequence

from ._tags import OWN_TAGS


def _shown(tag: str) -> bool:
    """A name given to ``s.log`` (a region's time summed over a stepless script is a total, as
    likely meant as not: not said)."""
    return not tag.startswith(OWN_TAGS)


def add(counts: Dict[str, int], tags: Dict[str, Any]) -> None:
    """Count the values a step's ``tags`` (tag -> value, or a list of several) hold."""
    for tag, v in tags.items():
        if tag.__class__ is str and _shown(tag):
            counts[tag] = counts.get(tag, 0) + (len(v) if v.__class__ is list else 1)


def tally(counts: Dict[str, int], step: int, opened: Dict[int, Dict[str, Any]],
          records: Iterable[Any]) -> Dict[str, int]:
    """``counts`` (what was written of ``step`` already) plus what the recorder still holds of
    it: its open step, and the records not taken from the buffer yet."""
    out = dict(counts)
    tags = opened.get(step)
    if tags is not None:
        add(out, tags)
    for rec in records:
        tag = rec[0]
        if rec[1] == step and tag.__class__ is str and _shown(tag):
            out[tag] = out.get(tag, 0) + 1
    return out


def message(counts: Dict[str, int], step: int, *, batches: bool = False,
            waiting: Sequence[str] = ()) -> Optional[str]:
    """What to say of a session that counted no step, or None when no tag got two values.

    ``batches``: a patched loader handed out batches in it; ``waiting``: the types of the patched
    optimizers that were to step in it and never did (then the batches were no steps).
    """
    many = sorted(((-n, tag) for tag, n in counts.items() if n > 1))
    if not many:
        return None
    said = [f"{tag!r} logged {-n} times (their mean)" for n, tag in many[:3]]
    if len(many) > 3:
        said.append(f"{len(many) - 3} more")
    head = (f"trainkit: this session counted no step, so everything logged without step= went "
            f"under step {step} and shows in TensorBoard merged there: {'; '.join(said)}. ")
    if batches and waiting:
        return head + (
            f"The patched loader's batches were no steps because the patched "
            f"{' and '.join(sorted(set(waiting)))} was to step (each optimizer.step() is a step) "
            "and never did: in training, check that the loop reaches optimizer.step() (and that "
            "a GradScaler does not skip every step for inf/nan gradients: "
            "trainkit/amp/skipped_steps); for an "
            "evaluation, run it under torch.no_grad() (each batch is then a step), or pass step= "
            "to s.log")
    return head + (
        "Steps are counted by a patched optimizer (tk.patch(optimizer): each optimizer.step() "
        "is a step) or, when no optimizer steps, by a patched loader (for batch in "
        "tk.patch(loader): each batch is a step); patch one inside the session, or pass step= "
        "to s.log")
