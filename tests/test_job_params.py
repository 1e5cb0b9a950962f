"""Each unlearning job's params hold only the run settings its method and optimiser read (the schema's x-reads), so
that a new setting reruns only the jobs that read it; code reading an undeclared setting fails naming the declaration.
The cached job through Snakemake: tests/test_workflow.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO
from idunlearn import config as config_module
from idunlearn.config import (ConfigError, job_run_settings, load_config, run_setting_names, run_setting_reads,
                              setting_readers, validate_config)
from idunlearn.unlearning import METHODS, build_method
from idunlearn.unlearning.base import ClosedFormMethod
from idunlearn.unlearning.optimisers import OPTIMISERS
from idunlearn.unlearning.runner import unlearn
from tiny_world import tiny_data, tiny_generator

OVERLAYS = ("study", "robust", "controllable", "many", "request")


def overlay_config(name: str) -> dict:
    return load_config(REPO / "config" / "config.yaml", yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text()))


def entry_reads(kind: str, name: str) -> set[str]:
    entry = run_setting_reads()[kind][name]
    return set(entry.get("reads", ())) | (entry_reads(kind, entry["extends"]) if "extends" in entry else set())


def test_piu_params_leave_out_piu_robust_settings_and_every_reader_gets_its_own():
    config = overlay_config("robust")
    piu, robust = job_run_settings(config, "piu"), job_run_settings(config, "piu_robust")
    attack = entry_reads("methods", "piu_robust") - entry_reads("methods", "piu")
    assert attack and not attack & set(piu)
    assert attack <= set(robust) and set(piu) - {"precision"} <= set(robust)  # the default piu run sets bf16
    assert {"lambda", "eta", "steps", "lr"} <= set(piu) and "eupmu_beta" not in piu and "uce_lambda" not in piu
    study = overlay_config("study")
    uce = job_run_settings(study, "uce")  # a closed-form edit reads neither the run loop's nor an optimiser's keys
    assert {"uce_lambda", "uce_preserve", "regime"} <= set(uce) and not {"steps", "lr", "lambda"} & set(uce)
    eupmu = validate_config({"unlearning": {"runs": {"e": {"optimiser": "eupmu", "eupmu_beta": 3.0}}}})
    assert job_run_settings(eupmu, "e")["eupmu_beta"] == 3.0 and "lambda" not in job_run_settings(eupmu, "e")


def test_declarations_cover_the_code_registries_and_the_schema():
    reads = run_setting_reads()
    assert set(reads["methods"]) == set(METHODS) and set(reads["optimisers"]) == set(OPTIMISERS)
    for name, cls in METHODS.items():
        assert reads["methods"][name].get("trains", True) == (not issubclass(cls, ClosedFormMethod)), name
    declared = set(reads["job"]) | set(reads["training"]) | set(reads["workflow"])
    declared |= {s for kind in ("methods", "optimisers") for name in reads[kind] for s in entry_reads(kind, name)}
    assert declared == set(run_setting_names()), declared ^ set(run_setting_names())
    readers = setting_readers()  # the configuration reference's "read by" column
    assert "method `piu_robust`" in readers["attack_lr"] and "method `piu`" not in readers["attack_lr"]
    assert readers["lr"] == ["every training run"] and readers["n_identities"] == ["the workflow rules"]
    assert {"method `piu`", "method `esd`", "method `wid`"} <= set(readers["eta"])


def test_reading_an_undeclared_setting_fails_naming_the_declaration(monkeypatch):
    settings = job_run_settings(validate_config({"unlearning": {"runs": {"w": {"method": "wid", "eta": 0.0}}}}), "w")
    build_method("wid", settings)  # declared: builds
    reads = yaml.safe_load(yaml.safe_dump(run_setting_reads()))  # a copy whose wid entry forgets eta
    reads["methods"]["wid"]["reads"].remove("eta")
    monkeypatch.setattr(config_module, "run_setting_reads", lambda: reads)
    with pytest.raises(KeyError, match=r"method 'wid' reads run setting 'eta'.*x-reads"):
        build_method("wid", settings)
    with pytest.raises(KeyError, match="'attack_lr'.*x-reads"):  # .get with a default fails the same way
        config_module.method_settings("piu", settings).get("attack_lr", 0.01)


def test_a_sweep_or_tuning_grid_over_a_setting_its_run_does_not_read_is_refused():
    with pytest.raises(ConfigError, match=r"'unlearning.sweeps.s.key'.*does not read 'uce_lambda'"):
        validate_config({"unlearning": {"sweeps": {"s": {"run": "piu", "key": "uce_lambda", "values": [1.0]}}}})
    with pytest.raises(ConfigError, match=r"'tuning.methods.piu.grid'.*does not read \['siss_beta'\]"):
        from idunlearn.tuning import tuning_settings

        tuning_settings(validate_config({"tuning": {"methods": {"piu": {"grid": {"siss_beta": [0.1]}}}}}))


class FlatRecognizer(torch.nn.Module):
    """(N, 3, 112, 112) in [0, 255] -> (N, 6): enough of a recognizer for WID's identity loss to run."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3 * 112 * 112, 6)

    def forward(self, images):
        return self.linear(images.flatten(1) / 255)


def shipped_runs() -> dict[tuple, tuple[str, str]]:
    """One run of each (method, optimiser, epsilon phase, epsilon scale) the shipped overlays declare."""
    kinds = {}
    for overlay in OVERLAYS:
        config = overlay_config(overlay)
        for name in config["unlearning"]["runs"]:
            run = job_run_settings(config, name)
            kinds.setdefault((run["method"], run["optimiser"], run.get("epsilon_phase"), run.get("epsilon_scale")),
                             (overlay, name))
    return kinds


@pytest.mark.parametrize("overlay,name", sorted(set(shipped_runs().values())))
def test_each_shipped_run_trains_on_its_job_params_alone(overlay, name, tmp_path):
    """A step of the run on exactly its job's params (a few sizes made tiny; a Phase II bound as the job sets it):
    every setting the code reads is declared, or the step fails."""
    run = job_run_settings(overlay_config(overlay), name)
    tiny = {"steps": 1, "forget_batch": 2, "retain_batch": 2, "attack_every": 1, "attack_steps": 1,
            "attack_restarts": 0, "adversarial_conditions": 1, "attack_batch": 2, "uce_erase_mixtures": 2}
    run.update({key: value for key, value in tiny.items() if key in run})
    if run.get("epsilon_fraction") is not None:
        run["epsilon"] = 0.5
    data = tiny_data(latents=True)
    data.recognizer = FlatRecognizer()
    log, _ = unlearn(tiny_generator(), build_method(run["method"], run), data, run, tmp_path / "s.pt", seed=0)
    assert len(log) == 1 and np.isfinite(log["forget_loss"]).all()

