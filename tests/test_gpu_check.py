"""`make gpu-check` (idunlearn.gpu_check) on a CPU with tiny shapes: every stage runs and is timed, the record has
the format `plan` reads, and a tiny record never prices a cluster run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from idunlearn import gpu_check
from idunlearn.plan import measurements

pytestmark = pytest.mark.slow

STAGES = {"load", "unlearn", "evaluate", "audit", "tables"}


# seconds a stage's work takes on the check's clock (below): each call of the wrapped function advances it so much
STAGE_SECONDS = {"build_generator": 5.0, "evaluate_generator": 1.0, "unlearn": 10.0, "score_probes": 3.0}


@pytest.fixture(scope="module")
def tiny_record(tmp_path_factory):
    """The tiny check on a clock that only the stages' work moves (``STAGE_SECONDS`` per call of the real
    functions), so that every timing of the record is known exactly."""
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_tiny.json"
    clock = [0.0]

    def advancing(name):
        real = getattr(gpu_check, name)

        def call(*args, **kwargs):
            clock[0] += STAGE_SECONDS[name]
            return real(*args, **kwargs)
        return call

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_check, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
        for name in STAGE_SECONDS:
            patch.setattr(gpu_check, name, advancing(name))
        argv = ["--tiny", "--device", "cpu", "--steps", "1", "--no-compile", "--output", str(out)]
        assert gpu_check.main(argv) == out
    return json.loads(out.read_text())


def test_every_stage_is_timed_where_its_work_runs(tiny_record):
    # 2 identities, one load: evaluate twice per identity (before and after), unlearn and audit once each; a timer
    # that overwrote instead of adding up, or a stage timed inside another's timer, would give other sums
    eager = tiny_record["modes"]["eager"]
    assert tiny_record["identities"] == gpu_check.N_IDENTITIES == 2
    assert eager["seconds"] == {"load": 5.0, "evaluate": 4 * 1.0, "unlearn": 2 * 10.0, "audit": 2 * 3.0, "tables": 0.0}
    assert eager["unlearn_seconds_per_step"] == 10.0  # 20 s over 1 step x 2 identities


def test_record_has_the_plan_format_but_a_tiny_check_prices_nothing(tiny_record):
    rows = {row["stage"]: row for row in tiny_record["measurements"]}
    assert set(rows) == {"unlearn", "evaluate", "audit"}
    # training in bf16; sampling in the generator's fp32, as the workflow's evaluation and audit jobs
    assert rows["unlearn"]["precision"] == "bf16" and rows["evaluate"]["precision"] == rows["audit"]["precision"] == "fp32"
    # per job: one model load plus its share of the stage (evaluate: 2 evaluations per identity)
    assert rows["unlearn"]["seconds_per_step"] == 10.0 and rows["unlearn"]["load_seconds"] == 5.0
    assert rows["evaluate"]["seconds_per_job"] == 4.0 / (2 * 2) + 5.0
    assert rows["audit"]["seconds_per_job"] == 6.0 / 2 + 5.0
    assert tiny_record["shapes"] == "tiny" and measurements([tiny_record]) == {}
    assert measurements([{**tiny_record, "shapes": "paper"}])["unlearn", "bf16"]["seconds_per_step"] == \
        rows["unlearn"]["seconds_per_step"]


def test_real_size_refuses_a_cpu():
    with pytest.raises(SystemExit, match="--tiny"):
        gpu_check.main(["--device", "cpu"])
