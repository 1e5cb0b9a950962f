import pytest
import yaml
from conftest import REPO

from idunlearn.config import (
    ConfigError,
    config_hash,
    deep_update,
    load_config,
    run_config,
    sweep_runs,
    validate_config,
)


@pytest.mark.parametrize("name", ["config.yaml", "celebahq.yaml"])
def test_shipped_configs_validate(name):
    cfg = load_config(REPO / "config" / name)
    assert cfg["identities"]["eps"] == 0.35 and cfg["identities"]["min_samples"] == 2
    assert cfg["selection"]["anchor"] == {"tau": 0.2, "tol": 0.01}


def overlaid(overlays: list[str]) -> dict:
    """config.yaml with ``overlays`` merged over it as snakemake --configfile a.yaml b.yaml does: each file key by key
    (lists replaced)."""
    merged = {}
    for name in overlays:
        merged = deep_update(merged, yaml.safe_load((REPO / "config" / name).read_text()))
    return load_config(REPO / "config" / "config.yaml", merged)


@pytest.mark.parametrize("overlays", [["study.yaml"], ["study.yaml", "robust.yaml"], ["controllable.yaml"],
                                      ["study.yaml", "robust.yaml", "rebuild.yaml"],
                                      ["study.yaml", "robust.yaml", "rebuild.yaml", "worstcase-one-seed.yaml"],
                                      ["study.yaml", "robust.yaml", "attack-samples.yaml"], ["many.yaml"],
                                      ["many.yaml", "many-one-order.yaml"], ["request.yaml"]])
def test_overlay_configs_validate_as_snakemake_merges_them(overlays):
    cfg = overlaid(overlays)
    if "robust.yaml" in overlays:
        assert cfg["unlearning"]["runs"]["piu_robust"]["method"] == "piu_robust"
        if "rebuild.yaml" not in overlays:
            assert cfg["audit"]["runs"] == ["piu_100", "piu_robust", "piu_meta", "piu_meta_at_theta", "uce.tuned",
                                            "esd.tuned", "retrain"]
        assert "siss" in cfg["unlearning"]["runs"]
        # piu_meta is piu_robust's run (a YAML merge key) with its own method and meta-learning settings
        robust, meta = cfg["unlearning"]["runs"]["piu_robust"], cfg["unlearning"]["runs"]["piu_meta"]
        assert {k: v for k, v in meta.items() if k != "method" and not k.startswith("meta_")} == \
            {k: v for k, v in robust.items() if k != "method"} and meta["method"] == "piu_meta"
    if "rebuild.yaml" in overlays:  # every rebuilt generator is an external model beside retrain; two audited first
        rebuilt = [e["name"] for e in cfg["evaluation"]["external"] if e["generator"].startswith("results/rebuild/")]
        assert len(rebuilt) == 7 and {"rebuild_a10.b25", "rebuild_a05.b25"} <= set(cfg["audit"]["runs"])
        assert {"piu_100", "retrain"} <= set(cfg["audit"]["runs"]) <= {*rebuilt, *cfg["unlearning"]["runs"], "retrain"}
    if "study.yaml" in overlays:  # the never-trained reference is audited as run retrain on the selection
        assert "retrain" in cfg["audit"]["runs"] and cfg["audit"]["verdict"]["reference"] == "retrain"
        assert {"name": "retrain", "generator": "reference", "identities": "selection"} in cfg["evaluation"]["external"]
    if "many.yaml" in overlays:  # the many stage's run is a declared one; off (null) without the overlay
        sizes = [1, 8] if "many-one-order.yaml" in overlays else [1, 2, 4, 8]  # the one-order overlay keeps the rest
        assert cfg["many"]["run"] in cfg["unlearning"]["runs"] and cfg["many"]["joint_sizes"] == sizes
        assert cfg["many"]["orders"] == (1 if "many-one-order.yaml" in overlays else 3)
        assert cfg["many"]["sequential_protections"] == ["replay"] and cfg["many"]["sequential_length"] == 8
        assert load_config(REPO / "config" / "config.yaml")["many"]["run"] is None
    if "worstcase-one-seed.yaml" in overlays:  # one seed everywhere, the protocol's other settings kept
        protocol = cfg["audit"]["probes"]["relearning_worstcase"]
        assert protocol["spread_identities"] == 0
        assert protocol == {**overlaid(overlays[:-1])["audit"]["probes"]["relearning_worstcase"], "spread_identities": 0}
    # more attack samples for the verdicts: a setting of its own beside the attack's, which the audit jobs read
    assert cfg["audit"]["attack_samples"] == (42 if "attack-samples.yaml" in overlays else 0)
    if "attack-samples.yaml" in overlays:
        attack = overlaid(overlays[:-1])["audit"]["probes"]["attack"]
        assert cfg["audit"]["probes"]["attack"] == attack
    if "request.yaml" in overlays:  # the request is on, served by a run of the base config
        assert cfg["request"]["folder"] and cfg["request"]["run"] in cfg["unlearning"]["runs"]


def test_paper_config_merged_over_the_offline_default_keeps_the_paper_settings():
    # snakemake loads config/config.yaml (the Snakefile's configfile) and merges celebahq.yaml over it key by key, so
    # a setting the offline default reduces must be restated there, or the paper setup silently inherits it
    paper = yaml.safe_load((REPO / "config" / "celebahq.yaml").read_text())
    cfg = load_config(REPO / "config" / "config.yaml", paper)
    piu = run_config(cfg, "piu")
    assert (piu["steps"], piu["forget_batch"], piu["retain_batch"], piu["precision"]) == (400, 32, 32, "fp32")
    ev = cfg["evaluation"]
    assert (ev["n_forget_samples"], ev["n_retain_samples"], ev["steps"], ev["guidance"]) == (25, 25, 25, 3.0)
    assert cfg["generator"]["backend"] == "arc2face" and cfg["faces"]["backend"] == "insightface"
    offline = run_config(load_config(REPO / "config" / "config.yaml"), "piu")  # the offline reductions it undoes
    assert (offline["steps"], offline["forget_batch"], offline["precision"]) == (200, 8, "bf16")


def test_job_threads_default_and_bound():
    assert validate_config({})["job_threads"] == 1
    with pytest.raises(ConfigError, match=r"job_threads"):
        validate_config({"job_threads": 0})


def test_defaults_fill_missing_sections():
    cfg = validate_config({})
    assert cfg["dataset"]["source"] == "orl"
    assert cfg["dataset"]["celebahq"]["revision"] == "7ecc6a45edfb5483ccf2f7df1035d298ffe7c76b"
    assert cfg["selection"]["forget_train_fraction"] == 0.65
    assert cfg["faces"]["insightface"]["det_size"] == [640, 640]


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"selection\.n_forget.*not of type 'integer'"):
        validate_config({"selection": {"n_forget": "three"}})


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match=r"identities.*'epsilon' was unexpected"):
        validate_config({"identities": {"epsilon": 0.3}})


def test_out_of_range_fraction_names_the_key():
    with pytest.raises(ConfigError, match=r"selection\.retain_train_fraction"):
        validate_config({"selection": {"retain_train_fraction": 1.0}})


def test_config_hash_ignores_key_order():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_sweeps_expand_into_runs_and_reuse_the_base_point():
    cfg = validate_config({"unlearning": {"runs": {"piu": {"steps": 7}}, "sweeps": {
        "lambda": {"run": "piu", "key": "lambda", "values": [0, 10, 20]},
        "tau": {"run": "piu", "key": "anchor_tau", "values": [0.1, 0.2]}}}})
    runs = cfg["unlearning"]["runs"]
    assert sorted(runs) == ["piu", "piu.anchor_tau_0.1", "piu.lambda_0", "piu.lambda_20"]
    assert run_config(cfg, "piu.lambda_20")["lambda"] == 20 and run_config(cfg, "piu.lambda_20")["steps"] == 7
    points = sweep_runs(cfg)
    assert [name for _, name, _, _ in points["lambda"]] == ["piu.lambda_0", "piu", "piu.lambda_20"]  # 10 = default
    assert [name for _, name, _, _ in points["tau"]] == ["piu.anchor_tau_0.1", "piu"]  # 0.2 = selection tau
    assert validate_config(cfg)["unlearning"]["runs"] == runs  # validating twice changes nothing


def test_bad_sweeps_name_the_key():
    with pytest.raises(ConfigError, match="unlearning.sweeps.x.key"):
        validate_config({"unlearning": {"sweeps": {"x": {"run": "piu", "key": "lamda", "values": [1]}}}})
    with pytest.raises(ConfigError, match="unlearning.sweeps.x.run"):
        validate_config({"unlearning": {"sweeps": {"x": {"run": "nope", "key": "lambda", "values": [1]}}}})
    with pytest.raises(ConfigError, match="lambda"):
        validate_config({"unlearning": {"sweeps": {"x": {"run": "piu", "key": "lambda", "values": ["big"]}}}})


def test_schema_method_and_optimiser_names_are_the_registries():
    from idunlearn.config import load_schema
    from idunlearn.unlearning import METHODS
    from idunlearn.unlearning.optimisers import OPTIMISERS
    unlearning = load_schema()["properties"]["unlearning"]["properties"]
    per_run = unlearning["runs"]["additionalProperties"]["properties"]
    for key, registry in (("method", METHODS), ("optimiser", OPTIMISERS)):
        assert unlearning["defaults"]["properties"][key]["enum"] == list(registry)
        assert per_run[key]["enum"] == list(registry)


def test_unknown_method_or_optimiser_names_the_run_before_any_job():
    for key, value in (("method", "nope"), ("optimiser", "adam")):
        with pytest.raises(ConfigError, match=rf"config key 'unlearning.runs.typo.{key}': '{value}' is not one of"):
            validate_config({"unlearning": {"runs": {"piu": {}, "typo": {key: value}}}})
