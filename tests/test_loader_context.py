"""A patched loader that is also a context manager (a tqdm progress bar: `with tqdm(loader) as
bar`) is one as the source is, and `with` gives the patched loader, so its batches are recorded."""
from __future__ import annotations

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars
from tests.helpers import loader, mlp, train


class Bar:
    """A tqdm-like wrapper: iterable, sized, a context manager that returns itself."""

    def __init__(self, iterable):
        self.iterable = iterable
        self.closed = False

    def __iter__(self):
        yield from self.iterable

    def __len__(self):
        return len(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.closed = True
        return False


def test_with_a_patched_context_manager_loader_records_its_batches(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bar = Bar(loader(n=32))
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        with tk.patch(bar) as batches:  # TypeError: not a context manager
            assert len(batches) == 4
            train(model, opt, batches)
    assert bar.closed
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/samples_per_s"]] == [1, 2, 3, 4]


def test_a_patched_loader_is_a_context_manager_only_where_its_source_is():
    patched = tk.patch(loader())
    assert not hasattr(patched, "__enter__")
    with pytest.raises((TypeError, AttributeError)):  # 3.11+: TypeError; 3.9/3.10: AttributeError: __enter__
        with patched:
            pass
    assert not hasattr(tk.patch(iter([1])), "__len__")
    assert hasattr(tk.patch(Bar([1])), "__exit__") and len(tk.patch(Bar([1]))) == 1


def test_tqdm_around_or_inside_the_patch(tmp_path):
    tqdm = pytest.importorskip("tqdm").tqdm
    import io

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tk.session(logdir=tmp_path, system_metrics=False):
        tk.patch(opt)
        with tk.patch(tqdm(loader(n=32), file=io.StringIO())) as bar:
            assert len(bar) == 4
            train(model, opt, bar)
        outer = tqdm(tk.patch(loader(n=32)), file=io.StringIO())
        assert len(outer) == 4
        for i, (x, y) in enumerate(outer):
            if i == 2:
                break
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)
    assert [st for st, _ in got["trainkit/step_time_ms"]] == [1, 2, 3, 4, 5, 6]
    items = [sps * ms / 1e3 for (_, sps), (_, ms) in zip(got["trainkit/samples_per_s"],
                                                         got["trainkit/step_time_ms"])]
    assert items == pytest.approx([8] * 6, rel=1e-4)
