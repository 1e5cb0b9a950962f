"""`make gpu-check` (idunlearn.gpu_check) on a CPU with tiny shapes: every stage runs and is timed, the record has
the format `plan` reads, and a tiny record never prices a cluster run."""

from __future__ import annotations

import json

import pytest

from idunlearn import gpu_check
from idunlearn.plan import measurements

pytestmark = pytest.mark.slow

STAGES = {"load", "unlearn", "evaluate", "audit", "tables"}


@pytest.fixture(scope="module")
def tiny_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_tiny.json"
    assert gpu_check.main(["--tiny", "--device", "cpu", "--steps", "1", "--no-compile", "--output", str(out)]) == out
    return json.loads(out.read_text())


def test_every_stage_runs_for_two_identities_and_is_timed(tiny_record):
    eager = tiny_record["modes"]["eager"]
    assert set(eager["seconds"]) == STAGES and all(s > 0 for s in eager["seconds"].values())
    assert tiny_record["identities"] == gpu_check.N_IDENTITIES == 2
    assert eager["unlearn_seconds_per_step"] > 0


def test_record_has_the_plan_format_but_a_tiny_check_prices_nothing(tiny_record):
    rows = {row["stage"]: row for row in tiny_record["measurements"]}
    assert set(rows) == {"unlearn", "evaluate", "audit"}
    # training in bf16; sampling in the generator's fp32, as the workflow's evaluation and audit jobs
    assert rows["unlearn"]["precision"] == "bf16" and rows["evaluate"]["precision"] == rows["audit"]["precision"] == "fp32"
    assert rows["unlearn"]["seconds_per_step"] > 0 and rows["evaluate"]["seconds_per_job"] > 0
    assert tiny_record["shapes"] == "tiny" and measurements([tiny_record]) == {}
    assert measurements([{**tiny_record, "shapes": "paper"}])["unlearn", "bf16"]["seconds_per_step"] == \
        rows["unlearn"]["seconds_per_step"]


def test_real_size_refuses_a_cpu():
    with pytest.raises(SystemExit, match="--tiny"):
        gpu_check.main(["--device", "cpu"])
