"""Stage logs: a decorated part of a stage reports its duration in the stage's log file and returns its result."""

from __future__ import annotations

import re

from idunlearn.runlog import logs_duration, stage_log


@logs_duration("squaring")
def square(value: int) -> int:
    return value * value


def test_a_timed_part_logs_its_duration_in_the_stage_log_and_returns_its_result(tmp_path):
    path = tmp_path / "stage.log"
    with stage_log(path, "demo"):
        assert square(7) == 49
    text = path.read_text()
    assert re.search(r"idunlearn INFO squaring took \d+\.\d s", text), text
    assert text.index("squaring took") < text.index("stage demo finished")
