"""Error metrics on hand-made examples."""

import pytest

from latsim.analysis.fidelity import error_pct, mape


def test_error_pct_is_signed_and_relative_to_the_measurement():
    assert error_pct(2.0, 2.2) == pytest.approx(10.0)
    assert error_pct(2.0, 1.5) == pytest.approx(-25.0)
    assert error_pct(-4.0, -3.0) == pytest.approx(25.0)
    assert error_pct(0.0, 0.1) is None
    assert error_pct(None, 1.0) is None and error_pct(1.0, None) is None


def test_mape_averages_absolute_errors_and_skips_undefined():
    assert mape([10.0, -30.0, None]) == pytest.approx(20.0)
    assert mape([None]) is None
    assert mape([]) is None
