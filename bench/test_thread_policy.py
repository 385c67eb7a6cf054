"""``bench/thread_policy.py`` runs (untimed in CI, so it cannot rot): one quick run of the command's
default policy, and the summary's ratios on made-up times."""

from __future__ import annotations

import pytest

from bench import thread_policy


def test_summary_ratios() -> None:
    times = {
        "default": {"idle": [10.0, 12.0], "loaded": [15.0, 15.0]},
        "two-spinning": {"idle": [10.0, 10.0], "loaded": [40.0, 30.0]},
        "two-passive": {"idle": [20.0, 20.0], "loaded": [25.0, 25.0]},
    }
    summary = thread_policy.summarise({"times": times})
    assert summary["default"] == {
        "idle_s": 11.0,
        "loaded_s": 15.0,
        "loaded_over_idle": 15.0 / 11.0,
        "idle_over_two_spinning_idle": 1.1,
        "idle_stopped": 0,
        "loaded_stopped": 0,
    }
    assert summary["two-spinning"]["loaded_over_idle"] == 3.5
    stopped = {p: {"idle": [False, False], "loaded": [False, p == "two-spinning"]} for p in times}
    counted = thread_policy.summarise({"times": times, "stopped": stopped})
    assert counted["two-spinning"]["loaded_stopped"] == 1 and counted["default"]["loaded_stopped"] == 0


def test_a_run_past_the_limit_is_stopped_and_counted_at_it() -> None:
    seconds, score = thread_policy.run_once("default", quick=True, limit=0.5)  # far below a run's time
    assert (seconds, score) == (0.5, None)
    with pytest.raises(ValueError, match="limit"):
        thread_policy.run_once("default", quick=True, limit=0)


def test_rounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rounds"):
        thread_policy.measure(0, quick=True)


@pytest.mark.slow
def test_one_quick_run_of_the_default_policy() -> None:
    seconds, (initial, final) = thread_policy.run_once("default", quick=True)
    assert seconds > 0
    assert -1.0 <= initial <= 1.0 and -1.0 <= final <= 1.0  # the default task's score range
