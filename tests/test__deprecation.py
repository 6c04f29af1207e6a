"""perturb/_deprecation.py: renamed arguments keep working for one release, with a warning
that points at the user's call."""
import warnings

import pytest

from perturb._deprecation import REMOVED_IN, renamed


def _public(new=1.0, *, old=None):
    return renamed("public", "old", old, "new", new, 1.0)


def test_old_name_gives_its_value_and_warns_at_the_callers_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _public(old=3.0) == 3.0
    (w,) = caught
    assert issubclass(w.category, FutureWarning) and w.filename == __file__
    assert f"removed in perturb {REMOVED_IN}" in str(w.message) and "use new=" in str(w.message)


def test_new_name_alone_does_not_warn_and_both_is_a_type_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _public(2.0) == 2.0
    with pytest.raises(TypeError, match="both old= .* and new="):
        _public(2.0, old=3.0)
