"""The FLAKES section (tests/conftest.py) says what failed, not only which test: a flake is
investigated in the next session from CI's output alone."""

from __future__ import annotations

from tests.conftest import _error_lines

GROUP_FAILURE = """\
  + Exception Group Traceback (most recent call last):
  |   File "/repo/.venv/lib/python3.11/site-packages/trio/_core/_run.py", line 1117, in __aexit__
  |     raise combined_error_from_nursery
  | ExceptionGroup: Exceptions from Trio nursery (1 sub-exception)
  +-+---------------- 1 ----------------
    | Traceback (most recent call last):
    |   File "/repo/tests/commits/test_coordinator.py", line 433, in test_survives
    |     second = await coordinator.commit(new_attempt("b"), {S: SeqSet([(11, 20)])})
    | trio.TooSlowError
    +------------------------------------
"""

PLAIN_FAILURE = """\
    def test_x():
>       assert f() == 3
E       assert 2 == 3
E        +  where 2 = f()

tests/test_x.py:4: AssertionError
"""


def test_an_exception_groups_failure_is_named_with_its_place():
    lines = _error_lines(GROUP_FAILURE)
    assert 'File "/repo/tests/commits/test_coordinator.py", line 433, in test_survives' in lines
    assert "trio.TooSlowError" in lines
    assert lines[-1] != "------------------------------------"


def test_pytests_own_error_lines_are_kept():
    assert _error_lines(PLAIN_FAILURE) == [
        "E       assert 2 == 3",
        "E        +  where 2 = f()",
        "tests/test_x.py:4: AssertionError",
    ]
