"""``s.log`` inside code torch.compile traces: each value recorded under its step, outside the
graph; the graph break at each call site, so whatever is logged recompiles nothing; and under
``fullgraph=True`` an error that names trainkit's ``s.log`` and says what to do."""
from __future__ import annotations

import sys

import pytest
import torch

import trainkit as tk
from tests.conftest import scalars


def test_log_inside_code_torch_compile_traces_records_each_value(tmp_path):
    # An auxiliary loss logged in a compiled model's forward: traced, s.log's appends to the
    # buffer the writer thread empties failed dynamo's guards ("Guard failed on the same frame
    # it was created") and the training crashed. It now runs outside the graph, as print()
    # would, and every value is written under its step.
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 3)

        def forward(self, x):
            h = self.a(x)
            tk.active().log("aux", h.pow(2).mean())
            return h

    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net, backend="eager")
    opt = tk.patch(torch.optim.SGD(net.parameters(), lr=0.1))
    xs = [torch.randn(4, 8) for _ in range(4)]
    with torch.no_grad():
        first = net.a(xs[0]).pow(2).mean().item()  # the first step's, before any update
    with tk.session(logdir=tmp_path, system_metrics=False):
        for x in xs:
            compiled(x).sum().backward()
            opt.step()
            opt.zero_grad()
    got = scalars(tmp_path)["aux"]
    assert [st for st, _ in got] == [1, 2, 3, 4]
    assert got[0][1] == pytest.approx(first, rel=1e-6)


class _LogsFiveKinds(torch.nn.Module):
    """A forward that logs a tensor, a float, an int, an int tensor and a value at a step."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.a(x)
        s = tk.active()
        s.log("t", h.mean())
        s.log("f", 2.5)
        s.log("i", 3)
        s.log("count", (h > 0).sum())
        s.log("at", h.sum(), step=42)
        return h


def _dynamo_clean():
    import torch._dynamo
    from torch._dynamo.utils import counters, guard_failures

    torch._dynamo.reset()
    counters.clear()
    return counters, guard_failures


@pytest.mark.parametrize("log_frames", ["skipped_at_start", "compiled_once"])
def test_log_in_compiled_code_recompiles_nothing_whatever_it_logs(tmp_path, monkeypatch,
                                                                  log_frames):
    # The graph break of s.log was inside log itself: its frame was compiled too, and one resume
    # function in log, shared by every call site, recompiled for each kind of value and step
    # logged (5 here; past recompile_limit, 8, dynamo warned and gave up on it). The break is now
    # at each call site, and log's own frames run as they are: skipped by dynamo from the
    # session's start, or (torch.compile first imported later, as here after a reset) from the
    # first time dynamo compiles one.
    import torch._dynamo.eval_frame

    from trainkit import _compiled

    if not hasattr(torch._dynamo.eval_frame, "set_code_exec_strategy"):
        pytest.skip("this torch's dynamo cannot be told to run s.log's frames as they are "
                    "(no eval_frame.set_code_exec_strategy, torch 2.4 and older)")
    counters, guard_failures = _dynamo_clean()
    if log_frames == "compiled_once":  # the skip the session's start made was lost (a reset)
        monkeypatch.setattr(_compiled, "_log_frames_skipped", True)
        torch._dynamo.eval_frame.reset_code(sys.modules["trainkit.session"].Session.log.__code__)
    else:
        monkeypatch.setattr(_compiled, "_log_frames_skipped", False)
    torch.manual_seed(0)
    net = _LogsFiveKinds()
    compiled = torch.compile(net, backend="eager")
    xs = [torch.randn(4, 8) for _ in range(3)]
    # One flush, the last: the values at step 42 (ahead of the step in progress) are written
    # by the next flush, and one due between the calls (a compile on a loaded CI machine takes
    # over flush_secs) wrote the later ones as a second point at 42.
    # Nothing counts steps: the three calls' values go under step 1, as the close says.
    with pytest.warns(RuntimeWarning, match="counted no step.*'f' logged 3 times"), \
            tk.session(logdir=tmp_path, system_metrics=False, flush_secs=3600):
        for x in xs:
            compiled(x)
    assert dict(guard_failures) == {}
    breaks = counters["graph_break"]  # one at each call site, traced once
    assert sum(n for reason, n in breaks.items() if "Session.log" in reason) == 5, breaks
    if log_frames == "compiled_once":  # that path was taken: log's frame compiled, once
        assert sum(n for r, n in breaks.items() if "_log_from_compiled_frame" in r) == 1, breaks
    got = scalars(tmp_path)
    with torch.no_grad():
        means = [net.a(x).mean().item() for x in xs]
    assert got["t"] == [(1, pytest.approx(sum(means) / 3, rel=1e-6))]  # one step: averaged
    assert got["f"] == [(1, 2.5)] and got["i"] == [(1, 3.0)]
    assert [st for st, _ in got["at"]] == [42] and len(got["count"]) == 1


def test_log_in_a_fullgraph_compiled_forward_says_what_to_do(tmp_path):
    # Under fullgraph=True the graph break is refused: the error named only torch's own
    # torch.compiler.disable ("Remove the torch.compiler.disable call", reason: None), which the
    # user never called. It now says it is trainkit's s.log, and what to do.
    import inspect

    if "_torchdynamo_disable_msg" not in inspect.getsource(torch._dynamo.eval_frame):
        pytest.skip("this torch's dynamo shows no reason for a disabled function (torch 2.4 "
                    "and older): its error names torch.compiler.disable only")
    _dynamo_clean()
    compiled = torch.compile(_LogsFiveKinds(), backend="eager", fullgraph=True)
    with tk.session(logdir=tmp_path, system_metrics=False):
        with pytest.raises(Exception, match=r"trainkit: s.log .*fullgraph=True, return the value"):
            compiled(torch.randn(4, 8))
