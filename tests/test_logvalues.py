"""What s.log accepts as a value: Decimal and Fraction as floats; complex still refused."""
from __future__ import annotations

import decimal
import fractions
import math

import pytest

import trainkit as tk
from trainkit._logvalues import to_scalar


def test_decimal_and_fraction_are_logged_as_floats():
    D = decimal.Decimal
    assert to_scalar("x", D("1.5")) == 1.5 and type(to_scalar("x", D("1.5"))) is float
    assert to_scalar("x", D("-0.1")) == -0.1
    assert math.isnan(to_scalar("x", D("NaN"))) and math.isnan(to_scalar("x", D("sNaN")))
    assert to_scalar("x", D("Infinity")) == math.inf and to_scalar("x", D("-Inf")) == -math.inf
    assert to_scalar("x", D("1e400")) == math.inf and to_scalar("x", D("-1e400")) == -math.inf
    assert to_scalar("x", fractions.Fraction(1, 4)) == 0.25
    assert to_scalar("x", fractions.Fraction(10 ** 400, 3)) == math.inf


def test_decimal_through_s_log_and_complex_still_refused(tmp_path):
    with pytest.warns(RuntimeWarning, match="'d' logged 2 times"), \
            tk.session(logdir=tmp_path, system_metrics=False) as s:
        s.log("d", decimal.Decimal("1.5"))
        s.log("d", decimal.Decimal("1.5"))  # a name seen before: the same path
        s.log("q", fractions.Fraction(3, 4))
        got = [(name, v) for name, _, v in list(s._buf) if name in ("d", "q")]
        with pytest.raises(TypeError, match="value must be a real number"):
            s.log("z", 1 + 2j)
        with pytest.raises(TypeError, match="value must be a real number"):
            s.log("z", decimal.Context)  # a type, no value
    assert got == [("d", 1.5), ("d", 1.5), ("q", 0.75)]
