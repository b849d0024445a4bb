"""``@tk.profile_region`` given what it cannot decorate as a function: refused, with the fix."""
from __future__ import annotations

import functools

import pytest
import torch

import trainkit as tk


def test_region_refuses_a_model_instance_and_names_the_fix():
    # model = tk.profile_region("forward")(model) made the model a function: its calls ran, and
    # the optimizer's model.parameters() then failed with "'function' object has no attribute".
    model = torch.nn.Linear(3, 2)
    with pytest.raises(TypeError, match=r"got the model Linear\(\.\.\.\).*def forward"):
        tk.profile_region("forward")(model)
    wrapped = tk.profile_region("forward")(model.forward)  # its bound forward is a function
    assert wrapped(torch.ones(1, 3)).shape == (1, 2)


@pytest.mark.parametrize("kind", ["property", "cached_property"])
def test_region_above_a_property_says_to_put_it_below(kind):
    make = property if kind == "property" else functools.cached_property
    with pytest.raises(TypeError, match=rf"got the {kind} '.*batch_size': put it below @{kind}"):
        class Loop:
            @tk.profile_region("size")
            @make
            def batch_size(self):
                return 8

    class Loop:  # the order the message gives works
        @make
        @tk.profile_region("size")
        def batch_size(self):
            return 8

    assert Loop().batch_size == 8


@pytest.mark.parametrize("bad", [42, None, "forward"])
def test_region_given_no_callable_shows_how_to_decorate(bad):
    with pytest.raises(TypeError) as info:
        tk.profile_region("step")(bad)
    said = str(info.value)
    assert f"got {bad!r}" in said
    assert "@tk.profile_region('step') above def" in said
    assert "with tk.profile_region('step')" in said


class _Fetch:
    async def __call__(self, n):
        return n


class _Stream:
    async def __call__(self, n):
        yield n


@pytest.mark.parametrize("make", [_Fetch, _Stream, lambda: functools.partial(_Fetch(), 1)],
                         ids=["async-call", "async-generator-call", "partial-of-one"])
def test_region_refuses_an_object_whose_call_is_async(make):
    # It was taken: the TimedObject timed only the creation of the coroutine, not its work
    obj = make()
    with pytest.raises(TypeError, match=r"async function '_(Fetch|Stream)\.__call__'.*"
                                        r"with tk.profile_region\('io'\)"):
        tk.profile_region("io")(obj)
