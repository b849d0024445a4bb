"""``tk.profile_region(name)(obj)`` on a callable object (an instance with ``__call__``, a
``functools.partial``): its calls are timed, and everything else is the object's.

A plain function came back in its place: ``functools.wraps`` copied none of its class's
attributes (``obj.extra`` worked, ``wrapped.extra`` raised AttributeError) and a snapshot of its
instance's, stale once the object changed them; and it could not be pickled (a ``collate_fn``
sent to DataLoader workers that spawn).
"""
from __future__ import annotations

import copy
import functools
import pickle
import time

import torch

import trainkit as tk
from tests.conftest import scalars


class Collate:
    """Stacks a batch."""

    extra = 3  # a class attribute

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        time.sleep(0.005)
        return torch.stack(batch)

    def describe(self) -> str:
        return f"collate after {self.calls} call(s)"


def test_a_callable_object_keeps_its_attributes_and_its_calls_are_timed(tmp_path):
    obj = Collate()
    wrapped = tk.profile_region("collate")(obj)
    assert wrapped.extra == 3 and wrapped.describe() == "collate after 0 call(s)"
    assert wrapped.__doc__ == "Stacks a batch." and wrapped.__wrapped__ is obj
    with tk.session(logdir=tmp_path):
        assert wrapped([torch.ones(2), torch.zeros(2)]).shape == (2, 2)
    assert wrapped.calls == 1 and obj.calls == 1  # live, not a copy made at decoration
    wrapped.extra = 5  # set on the object, as on an undecorated one
    assert obj.extra == 5
    del wrapped.extra
    assert obj.extra == Collate.extra == 3
    assert "describe" in dir(wrapped) and "tk.profile_region('collate')" in repr(wrapped)
    assert scalars(tmp_path)["trainkit/region/collate_ms"][0][1] >= 5


def test_a_decorated_object_pickles_and_copies_decorated():
    wrapped = tk.profile_region("collate")(Collate())
    wrapped.calls = 7
    for again in (pickle.loads(pickle.dumps(wrapped)), copy.deepcopy(wrapped)):
        assert again.calls == 7 and again is not wrapped
        assert again.__wrapped__ is not wrapped.__wrapped__
        assert "tk.profile_region('collate')" in repr(again)
        again([torch.ones(1)])
        assert again.calls == 8 and wrapped.calls == 7


def test_a_partial_keeps_its_attributes_and_a_generator_object_times_each_item(tmp_path):
    part = tk.profile_region("scale")(functools.partial(torch.mul, other=2.0))
    assert part.keywords == {"other": 2.0} and part.func is torch.mul
    assert part(torch.ones(1)).item() == 2.0

    class Batches:
        def __call__(self, n):
            for i in range(n):
                time.sleep(0.005)
                yield i

    gen = tk.profile_region("make")(Batches())
    # a partial of one too: it had only the generator's creation timed (got ~0 ms)
    part_gen = tk.profile_region("make_part")(functools.partial(Batches(), 3))
    with tk.session(logdir=tmp_path):
        for _ in gen(3):
            time.sleep(0.05)  # the consumer's time: not the region's
        for _ in part_gen():
            time.sleep(0.05)
    for region in ("make", "make_part"):
        got = scalars(tmp_path)[f"trainkit/region/{region}_ms"][0][1]
        assert 15 <= got < 100, (region, got)
