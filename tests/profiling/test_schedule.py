"""ProfileSchedule's validation: numpy integers accepted (as tk.session(log_every=...) takes
them), a value of the wrong type a TypeError, one out of range a ValueError, each naming the value
and the fix."""
from __future__ import annotations

import re

import numpy as np
import pytest

import trainkit as tk


def test_numpy_integers_are_accepted_as_plain_ints():
    s = tk.ProfileSchedule(wait=np.int64(2), warmup=np.int32(1), active=np.uint8(3),
                           repeat=np.int16(2))
    assert (s.wait, s.warmup, s.active, s.repeat) == (2, 1, 3, 2)
    assert all(type(v) is int for v in (s.wait, s.warmup, s.active, s.repeat))
    assert repr(s) == "ProfileSchedule(wait=2, warmup=1, active=3, repeat=2, gzip=False)"
    assert s == tk.ProfileSchedule(wait=2, warmup=1, active=3, repeat=2)
    assert tk.ProfileSchedule(0, 0, 1, gzip=np.bool_(True)).gzip is True


@pytest.mark.parametrize("name, value", [("wait", "1"), ("wait", 1.5), ("active", 2.0),
                                         ("repeat", None), ("warmup", True), ("active", [1]),
                                         ("wait", np.float64(1.0))])
def test_a_value_of_the_wrong_type_is_a_type_error_naming_it(name, value):
    kw = dict(wait=0, warmup=0, active=1)
    kw[name] = value
    shown = re.escape(repr(value))
    with pytest.raises(TypeError, match=rf"ProfileSchedule\({name}={shown}\): {name} must be an "
                                        rf"int .*e\.g\. ProfileSchedule\(wait=10"):
        tk.ProfileSchedule(**kw)


@pytest.mark.parametrize("name, value, minimum", [("wait", -1, 0), ("warmup", np.int64(-2), 0),
                                                  ("active", 0, 1), ("repeat", 0, 1)])
def test_a_value_out_of_range_is_a_value_error_naming_it(name, value, minimum):
    kw = dict(wait=0, warmup=0, active=1)
    kw[name] = value
    with pytest.raises(ValueError, match=rf"ProfileSchedule\({name}={int(value)}\): {name} must be "
                                         rf"an int >= {minimum}"):
        tk.ProfileSchedule(**kw)


def test_gzip_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"ProfileSchedule\(gzip=1\): gzip must be True or False"):
        tk.ProfileSchedule(wait=0, warmup=0, active=1, gzip=1)
