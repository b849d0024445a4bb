"""tk.patch(loader): the patched loader keeps its source's length, attributes and epochs (a
generator has no length), and what it measures of each step: the wait for the batch, and the items
samples/s counts in it (dicts, nested and per-sample records, batches that change shape mid-pass,
the batches an accumulation window adds up)."""
from __future__ import annotations

import time

import pytest
import torch

import trainkit as tk
from trainkit.loader import PatchedLoader
from trainkit.recorder import BATCH_REC
from tests.conftest import scalars
from tests.helpers import items_per_step, loader, mlp


class SlowDataset(torch.utils.data.Dataset):
    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return torch.full((4,), float(i)), i % 2


def test_patched_loader_keeps_len_attributes_and_epochs():
    dl = loader(n=40, batch_size=8)
    p = tk.patch(dl)
    assert len(p) == 5 and p.dataset is dl.dataset and p.batch_size == 8
    first = [x.clone() for x, _ in p]
    second = [x.clone() for x, _ in p]
    assert len(first) == len(second) == 5
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert tk.patch(p) is p and tk.unpatch(p) is dl


def test_a_patched_source_without_len_has_none_and_is_true():
    import collections.abc

    gen = (torch.zeros(2) for _ in range(3))
    p = tk.patch(gen)
    assert bool(p) and not hasattr(p, "__len__") and not isinstance(p, collections.abc.Sized)
    sized = tk.patch([])
    assert len(sized) == 0 and not sized and isinstance(sized, collections.abc.Sized)
    # both patched loaders: tk.unpatch takes either
    assert isinstance(sized, PatchedLoader) and isinstance(p, PatchedLoader)


def test_generator_source_without_len():
    p = tk.patch(x for x in range(3))
    with pytest.raises(TypeError):
        len(p)
    assert list(p) == [0, 1, 2]


def test_data_wait_reflects_a_slow_dataset(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1)
    ds = SlowDataset(12, delay=0.01)
    with tk.session(logdir=tmp_path):
        tk.patch(opt)
        for x, y in tk.patch(torch.utils.data.DataLoader(ds, batch_size=4)):
            opt.step()
    got = scalars(tmp_path)
    waits = [v for _, v in got["trainkit/data_wait_ms"]]
    assert len(waits) == 3 and all(v >= 40 for v in waits)  # 4 items x 10 ms each
    assert [v for _, v in got["trainkit/samples_per_s"]] == pytest.approx(
        [4 / (ms / 1e3) for _, ms in got["trainkit/step_time_ms"]], rel=1e-4)
    del model


def test_items_from_dicts_and_nested_batches(tmp_path):
    batches = [{"ids": torch.zeros(5, 3), "mask": torch.zeros(7)}, ([torch.zeros(2, 1)], 0)]
    with tk.session(logdir=tmp_path):
        for _ in tk.patch(batches):
            time.sleep(0.002)
    got = scalars(tmp_path)
    # No optimizer patched: each batch is a step, and items come from the first tensor.
    sps = dict(got["trainkit/samples_per_s"])
    assert [st for st, _ in got["trainkit/data_wait_ms"]] == [1, 2]
    assert set(sps) <= {1, 2}
    steps = dict(got["trainkit/step_time_ms"])
    for st, v in sps.items():
        assert v == pytest.approx({1: 5, 2: 2}[st] / (steps[st] / 1e3), rel=1e-4)


class DetectionDataset(torch.utils.data.Dataset):
    """torchvision's detection samples: an image and a dict of its boxes and labels."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        return torch.zeros(3, 16, 16), {"boxes": torch.rand(i % 3 + 1, 4), "labels": torch.ones(i % 3 + 1)}


@pytest.mark.parametrize("collate, per_step", [
    (lambda b: tuple(zip(*b)), [4, 4, 4]),  # torchvision's detection reference: (images, targets)
    (lambda b: [t for _, t in b], [4, 4, 4]),  # a list of per-sample dicts
    (lambda b: [b[0][1]], [1, 2, 3]),  # one dict: may be a collated batch, so its first tensor
])
def test_items_of_a_batch_of_per_sample_records(tmp_path, collate, per_step):
    # An image's first dimension is its 3 channels: samples_per_s said 3 per batch of 4 images.
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    dl = torch.utils.data.DataLoader(DetectionDataset(), batch_size=4, collate_fn=collate)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        for batch in tk.patch(dl):
            time.sleep(0.002)
            opt.step()
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    items = [round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]]
    assert items == per_step


def test_items_when_batches_change_shape_mid_pass(tmp_path):
    """The loader counts (tensor, ...) batches inline once it knows the layout; batches that
    leave that layout (an empty tuple, a non-tensor first) are counted the general way."""
    batches = [(torch.zeros(3, 2), 1), (torch.zeros(6, 2), 1), (), ([torch.zeros(4, 1)], 0),
               (torch.zeros((), dtype=torch.float32),), [torch.zeros(2, 9)]]
    with tk.session(logdir=tmp_path):
        for _ in tk.patch(batches):
            time.sleep(0.002)
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    items = {st: round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]}
    assert items == {1: 3, 2: 6, 4: 4, 5: 1, 6: 2}  # step 3, the empty tuple, has no items


def test_accumulated_batches_add_up_within_a_step(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path):
        tk.patch(opt)
        for i, (x, y) in enumerate(tk.patch(loader(n=64, batch_size=8))):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if i % 4 == 3:
                opt.step()
                opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2]
    for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"], got["trainkit/step_time_ms"]):
        assert sps == pytest.approx(32 / (ms / 1e3), rel=1e-4)


def test_items_of_packed_sequences_are_the_sequences(tmp_path):
    # An RNN's batch, (PackedSequence, labels): its data's first dimension is the time steps of
    # all the sequences (3 + 5 + 2 = 10 here), and samples/s counted those, not the 3 sequences.
    def packed(lengths):
        seqs = [torch.ones(n, 4) for n in lengths]
        return torch.nn.utils.rnn.pack_sequence(seqs, enforce_sorted=False)

    batches = [(packed([3, 5, 2]), torch.zeros(3)), (packed([4, 4]), torch.zeros(2)),
               {"x": packed([1, 2, 3, 4]), "y": torch.zeros(4)}]
    assert items_per_step(tmp_path, batches) == {1: 3, 2: 2, 3: 4}


def test_a_patched_loader_indexes_as_its_source(tmp_path):
    # A list of batches looked at before the loop (batches[0]): "'SizedPatchedLoader' object is
    # not subscriptable". Indexing records nothing; only a pass is the loop's.
    batches = [(torch.zeros(2, 3),), (torch.ones(4, 3),)]
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        p = tk.patch(batches)
        assert p[1] is batches[1] and p[-1] is batches[-1] and p[:1] == batches[:1]
        assert [r for r in s._buf if r[0] is BATCH_REC] == []
    with pytest.raises(TypeError, match="'generator' object is not subscriptable"):
        tk.patch(x for x in range(3))[0]


def test_a_patched_iterator_hands_out_batches_with_next(tmp_path):
    # A loop that counts steps takes its batches with next() from tk.patch(itertools.cycle(...)):
    # before, "'PatchedLoader' object is not an iterator".
    import collections.abc
    import itertools

    batches = [(torch.zeros(n, 3), torch.zeros(n)) for n in (2, 3, 4)]
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        it = tk.patch(itertools.cycle(batches))
        assert isinstance(it, collections.abc.Iterator)
        for _ in range(5):
            x, _y = next(it)
            time.sleep(0.002)
            model(x).sum().backward()
            opt.step()
    got = scalars(tmp_path)
    steps = dict(got["trainkit/step_time_ms"])
    assert sorted(steps) == [1, 2, 3, 4, 5]
    assert {st: round(v * steps[st] / 1e3) for st, v in got["trainkit/samples_per_s"]} == {
        1: 2, 2: 3, 3: 4, 4: 2, 5: 3}
    assert len(got["trainkit/data_wait_ms"]) == 5
    # a source that is no iterator gives none, as unpatched; an exhausted one stops again
    assert not hasattr(tk.patch(batches), "__next__")
    gen = tk.patch(b for b in batches[:1])
    assert next(gen) is batches[0]
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(gen)


class _ByIndex:
    """Batches served by index, with no __iter__: Python iterates it from 0 to IndexError."""

    def __init__(self, batches):
        self.batches = batches

    def __getitem__(self, i):
        return self.batches[i]


def test_a_source_iterated_by_index_is_patched(tmp_path):
    # Before: refused as "expected ... an iterable data loader", though for and iter() take it.
    batches = [(torch.zeros(n, 3),) for n in (2, 5)]
    assert items_per_step(tmp_path, _ByIndex(batches)) == {1: 2, 2: 5}
    with pytest.raises(TypeError, match="expected a torch.optim.Optimizer or an iterable"):
        tk.patch(object())
    # A map-style Dataset iterates by index too, sample by sample: the DataLoader over it was meant
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 7))
    with pytest.raises(TypeError, match=r"a map-style TensorDataset is what a DataLoader takes "
                                        r"samples from; patch the DataLoader that batches it"):
        tk.patch(ds)
    dl = torch.utils.data.DataLoader(ds, batch_size=4)
    assert items_per_step(tmp_path / "iterable", dl) == {1: 4}


def _items_and_steps(logdir):
    got = scalars(logdir)
    steps = dict(got.get("trainkit/step_time_ms", []))
    return {st: round(v * steps[st] / 1e3) for st, v in got.get("trainkit/samples_per_s", [])}


def test_a_for_loop_goes_on_with_the_pass_next_began(tmp_path):
    # An evaluation (batches are steps): the batch next() took was dropped as a loop left
    # early when the for loop began a pass of its own, {1: 3, 2: 4, 3: 5}.
    batches = [torch.zeros(n, 3) for n in (2, 3, 4, 5)]
    with tk.session(logdir=tmp_path, system_metrics=False):
        it = tk.patch(iter(batches))
        with torch.no_grad():
            next(it)
            time.sleep(0.005)
            for _ in it:
                time.sleep(0.005)
    assert _items_and_steps(tmp_path) == {1: 2, 2: 3, 3: 4, 4: 5}


def test_a_first_batch_under_no_grad_leaves_the_training_batches_counted(tmp_path):
    # The pass next() began under no_grad (a look at shapes) was an evaluation's to its end:
    # no training step had items.
    import itertools

    batches = [(torch.zeros(4, 3), torch.zeros(4))] * 3
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        it = tk.patch(itertools.cycle(batches))
        with torch.no_grad():
            model(next(it)[0])
        for _ in range(4):
            model(next(it)[0]).sum().backward()
            opt.step()
    assert set(_items_and_steps(tmp_path).values()) == {4} and len(_items_and_steps(tmp_path)) >= 3


def test_a_validation_batch_taken_with_next_leaves_the_log_at_the_training_batchs_step(tmp_path):
    import itertools

    train = [(torch.full((4, 3), float(i)),) for i in range(1, 5)]
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        tk.patch(opt)
        val = tk.patch(itertools.cycle([(torch.zeros(2, 3),)]))
        for (x,) in tk.patch(train):
            model(x).sum().backward()
            opt.step()
            with torch.no_grad():
                model(next(val)[0])
            s.log("batch", x[0, 0])
    assert scalars(tmp_path)["batch"] == [(i, float(i)) for i in range(1, 5)]


def test_next_as_on_the_source_when_the_source_rewinds_and_after_a_copy():
    import copy
    import pickle

    class Rewinding:  # __iter__ starts over: next() on it does not call it
        def __init__(self):
            self.i = 0

        def __iter__(self):
            self.i = 0
            return self

        def __next__(self):
            self.i += 1
            if self.i > 3:
                raise StopIteration
            return self.i

    src = Rewinding()
    next(src)
    p = tk.patch(src)
    got = []
    for _ in range(5):
        try:
            got.append(next(p))
        except StopIteration:
            got.append("stop")
    assert got == [2, 3, "stop", "stop", "stop"]
    gen = tk.patch(iter([1, 2, 3]))
    assert next(gen) == 1
    for twin in (pickle.loads(pickle.dumps(gen)), copy.deepcopy(gen)):
        assert next(twin) == 2  # its own pass over its own copy of the source
    assert next(gen) == 2


def test_a_pass_next_began_in_one_session_is_a_new_one_in_the_next(tmp_path):
    ds = torch.utils.data.TensorDataset(torch.zeros(64, 3))
    dl = torch.utils.data.DataLoader(ds, batch_size=4)

    class Wrap:  # the user's iterator holding the DataLoader
        def __init__(self, loader):
            self.loader, self.it = loader, iter(loader)

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.it)

    it = tk.patch(Wrap(dl))
    model = torch.nn.Linear(3, 1)
    opt = tk.patch(torch.optim.SGD(model.parameters(), lr=0.1))
    for k in range(2):
        with tk.session(logdir=tmp_path / str(k), system_metrics=False):
            for _ in range(3):
                model(next(it)[0]).sum().backward()
                opt.step()
        got = scalars(tmp_path / str(k))
        assert got["trainkit/loader/0/passes"] == [(1, 1.0)]
        assert len(got["trainkit/samples_per_s"]) >= 2


def test_a_validation_iterator_that_runs_out_leaves_the_log_at_the_training_batchs_step(tmp_path):
    # try: next(val) except StopIteration: val = tk.patch(iter(vals)): at each run-out the value
    # logged next went a step on, merged into the next step's mean.
    vals = [(torch.zeros(2, 3),)] * 2
    train = [(torch.full((4, 3), float(i)),) for i in range(1, 7)]
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with tk.session(logdir=tmp_path, system_metrics=False) as s:
        tk.patch(opt)
        val = tk.patch(iter(vals))
        for (x,) in tk.patch(train):
            model(x).sum().backward()
            opt.step()
            with torch.no_grad():
                try:
                    vb = next(val)
                except StopIteration:
                    val = tk.patch(iter(vals))
                    vb = next(val)
                model(vb[0])
            s.log("batch", x[0, 0])
    assert scalars(tmp_path)["batch"] == [(i, float(i)) for i in range(1, 7)]


def test_next_under_no_grad_inside_a_for_loop_over_the_same_pass_leaves_the_loop_going():
    # It ended the pass the for loop read (grad mode changed), and the loop stopped, unsaid.
    it = tk.patch(iter(range(8)))
    seen = [next(it)]
    for b in it:
        seen.append(b)
        if b == 3:
            with torch.no_grad():
                seen.append(("val", next(it)))
    assert seen == [0, 1, 2, 3, ("val", 4), 5, 6, 7]


def test_a_batch_peeked_under_no_grad_before_a_for_loop_leaves_its_batches_counted(tmp_path):
    batches = [(torch.zeros(4, 3),)] * 6
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        it = tk.patch(iter(batches))
        with torch.no_grad():
            model(next(it)[0])  # a look at shapes: no step
        for (x,) in it:
            model(x).sum().backward()
            opt.step()
    assert _items_and_steps(tmp_path) == {n: 4 for n in range(1, 6)}


def test_a_copy_of_a_patched_loader_is_the_patch_of_a_copy_of_its_source(tmp_path):
    # copy.copy shared the source: next() on the copy took the original's batches, and a list
    # appended to through one showed in the other, where unpatched copies are independent.
    import copy
    import itertools

    def taken(make):  # next() on the original, then 3 on its copy, then 1 on the original
        it = make()
        first = next(it)
        try:
            twin = copy.copy(it)
        except TypeError as exc:  # Python 3.14 copies no itertools object: raised as unpatched
            return first, type(exc), next(it)
        return first, [next(twin) for _ in range(3)], next(it)

    for make in (lambda: iter([1, 2, 3, 4]), lambda: itertools.cycle([1, 2, 3])):
        assert taken(lambda: tk.patch(make())) == taken(make)
    assert taken(lambda: tk.patch(iter([1, 2, 3, 4]))) == (1, [2, 3, 4], 2)  # independent
    it = tk.patch(iter([1]))
    assert type(copy.copy(it)) is type(it)
    batches = [(torch.zeros(2, 3),)]
    p = tk.patch(batches)
    q = copy.copy(p)
    q.append((torch.zeros(5, 3),))  # a list's copy is a new list, as unpatched
    assert len(p) == 1 and len(q) == 2 and p.source is batches
    assert items_per_step(tmp_path, q) == {1: 2, 2: 5}  # and a patched loader like any other
    with pytest.raises(TypeError, match="generator"):  # as copy.copy(generator) itself raises
        copy.copy(tk.patch(b for b in batches))


class _Slow:
    """A source whose batches take a while, as a loader's do."""

    def __init__(self, items, wait):
        self.it, self.wait = iter(items), wait

    def __iter__(self):
        return self

    def __next__(self):
        time.sleep(self.wait)
        return next(self.it)


def _in_threads(*bodies):
    """Run each body in a thread of its own, wait for all; what they raised (StopIteration
    ends a body as its source running out, not as an error)."""
    import threading

    errors = []

    def run(body):
        try:
            body()
        except StopIteration:
            pass
        except BaseException as exc:  # noqa: B036 - the test reports what a thread raised
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_calling_next_on_one_patched_iterator_take_turns(tmp_path):
    # The second thread's next() while the first waited for its batch raised ValueError
    # ("generator already executing"); unpatched, a list's or a DataLoader's iterator serves both.
    got = []
    with tk.session(logdir=tmp_path, system_metrics=False):
        it = tk.patch(_Slow([(torch.zeros(2, 3),)] * 40, 0.002))

        def take():
            for _ in range(20):
                got.append(next(it))

        errors = _in_threads(take, take)
        assert errors == [] and len(got) == 40
        with pytest.raises(StopIteration):
            next(it)


def test_a_for_loop_and_next_in_two_threads_take_turns_on_one_pass(tmp_path):
    # The for loop going on with the pass next() began read it without the lock: next() in the
    # other thread, meanwhile, raised "generator already executing".
    got = []
    with tk.session(logdir=tmp_path, system_metrics=False):
        it = tk.patch(_Slow(range(60), 0.001))
        got.append(next(it))  # the for loop goes on with this pass

        def loop():
            for b in it:
                got.append(b)

        def take():
            for _ in range(20):
                got.append(next(it))

        errors = _in_threads(loop, take)
    assert errors == [] and sorted(got) == list(range(60))
