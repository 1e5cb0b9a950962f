"""Configuration: load YAML, validate against the JSON schema, fill in defaults."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(str(resources.files("idunlearn") / "schema" / "config.schema.yaml"))


class ConfigError(ValueError):
    """The configuration does not match the schema; the message names the key."""


# a run named <run>.tuned is <run> at the setting the tuning protocol chose (idunlearn.tuning)
TUNED_SUFFIX = ".tuned"


def tuned_run_name(base: str) -> str:
    return f"{base}{TUNED_SUFFIX}"


def tuned_base(run: str) -> str | None:
    """The paper-setting run a ``<run>.tuned`` run was tuned from; None for any other run."""
    return run[: -len(TUNED_SUFFIX)] if run.endswith(TUNED_SUFFIX) else None


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _validator_with_defaults(schema: dict) -> jsonschema.protocols.Validator:
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def fill_defaults(validator, properties, instance, schema_node):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema_node)

    extended = jsonschema.validators.extend(base, {"properties": fill_defaults})
    return extended(schema)


def _validate(config: dict) -> dict:
    validator = _validator_with_defaults(load_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"config key '{key}': {err.message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines) + f"\n(schema: {SCHEMA_PATH})")
    return config


def validate_config(config: dict) -> dict:
    """Validate ``config`` in place (defaults are added, ablation sweeps expanded into ``unlearning.runs``) and
    return it; raise ConfigError naming the bad key."""
    _validate(config)
    runs = config["unlearning"]["runs"]
    for points in sweep_runs(config).values():
        for value, name, key, base in points:
            runs.setdefault(name, {**runs[base], key: value})
    for points in controllable_runs(config).values():
        for _, name, overrides in points:
            runs.setdefault(name, overrides)
    for base in config["tuning"]["methods"]:
        if base not in runs:
            raise ConfigError(f"config key 'tuning.methods.{base}': {base!r} is not in unlearning.runs; tune a "
                              "declared run")
        if config["tuning"]["study"]:  # the settings come from the tuning's choice (tuning.tuned_settings)
            runs.setdefault(tuned_run_name(base), dict(runs[base]))
    check_external_models(config)
    return _validate(config)


def check_external_models(config: dict) -> None:
    """Each external model (``evaluation.external``) has a new run name, and its UNet exists or is one the export
    rule makes (a path under ``<results_dir>/export/``, so that one workflow run can export and re-import)."""
    export = Path(os.path.abspath(config["results_dir"]), "export")
    taken = {*config["unlearning"]["runs"], "original"}  # "original": the audit's name of the original model
    for index, entry in enumerate(config["evaluation"]["external"]):
        key = f"evaluation.external.{index}"
        if entry["name"] in taken:
            raise ConfigError(f"config key '{key}.name': {entry['name']!r} is already a run name (an unlearning run, "
                              "'original' or an earlier external model); choose another")
        taken.add(entry["name"])
        if "generator" in entry:
            check_external_generator(config, key, entry["generator"])
            continue
        path = Path(os.path.abspath(entry["unet"]))
        if path.is_file() and path.suffix != ".safetensors":
            raise ConfigError(f"config key '{key}.unet': {entry['unet']} is neither a diffusers UNet folder nor a "
                              "delta .safetensors file")
        if not path.exists() and export not in path.parents:
            raise ConfigError(f"config key '{key}.unet': {entry['unet']} does not exist; give a diffusers UNet "
                              "folder or a delta .safetensors file (`snakemake export` writes both under "
                              f"{config['results_dir']}/export/)")


def check_external_generator(config: dict, key: str, folder: str) -> None:
    """An external whole generator needs the mini backend, and a folder that exists unless it is ``reference`` (the
    never-trained reference: generator.reference.checkpoint, or train_generator_reference's output) or a rebuilt
    generator under <results_dir>/rebuild/ (the rebuild_budget rule's output)."""
    if config["generator"]["backend"] != "mini":
        raise ConfigError(f"config key '{key}.generator': a whole generator replaces generator.backend mini only "
                          f"(backend is {config['generator']['backend']!r}); give an Arc2Face model as a unet")
    rebuilt = Path(os.path.abspath(config["results_dir"]), "rebuild") in Path(os.path.abspath(folder)).parents
    if folder != "reference" and not rebuilt and not Path(folder).is_dir():
        raise ConfigError(f"config key '{key}.generator': {folder} is no folder; give a mini generator folder "
                          f"(model.safetensors + config.json), `reference`, or a rebuild's under "
                          f"{config['results_dir']}/rebuild/ (`snakemake rebuild`)")


EPSILON_BOUNDARIES = ("highest", "lowest")


def controllable_runs(config: dict) -> dict[str, list[tuple[str, str, dict]]]:
    """Controllable unlearning (epsilon-constrained paper, Section 4.3) of each configured base run: (point,
    run name, run settings) in order of decreasing completeness: Phase I ``highest``, the Phase II fractions
    (epsilon at that fraction of the range from the highest to the lowest boundary), the ``lowest`` boundary (the
    paper's Phase I run with exchanged roles, or the original model: the schema's ``controllable.lowest``)."""
    unlearning, out = config["unlearning"], {}
    for base, spec in unlearning.get("controllable", {}).items():
        if base not in unlearning["runs"]:
            raise ConfigError(f"config key 'unlearning.controllable.{base}': {base!r} is not in unlearning.runs")
        settings = {**unlearning["runs"][base], **spec.get("overrides", {}), "optimiser": "epsilon_constrained"}
        points = [("highest", f"{base}.eps_highest", {**settings, "epsilon_phase": "highest"})]
        points += [(str(f), f"{base}.eps_{f}", {**settings, "epsilon_phase": "controlled", "epsilon_fraction": f})
                   for f in sorted(spec["fractions"])]
        lowest = {"original": "original", "phase_one": "lowest"}[spec["lowest"]]
        points.append(("lowest", f"{base}.eps_lowest", {**settings, "epsilon_phase": lowest}))
        out[base] = points
    return out


def epsilon_boundary_runs(config: dict, name: str) -> list[str]:
    """The two Phase I runs a Phase II run takes its epsilon range from (none for any other run)."""
    if run_config(config, name).get("epsilon_fraction") is None:
        return []
    base = name.rsplit(".eps_", 1)[0]
    boundaries = [f"{base}.eps_{b}" for b in EPSILON_BOUNDARIES]
    missing = [b for b in boundaries if b not in config["unlearning"]["runs"]]
    if missing:
        raise ConfigError(f"config key 'unlearning.runs.{name}.epsilon_fraction': needs the Phase I runs {missing}; "
                          "declare the run through unlearning.controllable instead")
    return boundaries


def sweep_runs(config: dict) -> dict[str, list[tuple[Any, str, str, str]]]:
    """Each ablation sweep's points (value, run name, key, base run). A point equal to its base run's setting is
    the base run itself (no duplicate job); the others are named ``<base>.<key>_<value>``."""
    unlearning, out = config["unlearning"], {}
    for sweep, spec in unlearning.get("sweeps", {}).items():
        base, key = spec["run"], spec["key"]
        if base not in unlearning["runs"]:
            raise ConfigError(f"config key 'unlearning.sweeps.{sweep}.run': {base!r} is not in unlearning.runs")
        if key not in unlearning["defaults"]:
            raise ConfigError(f"config key 'unlearning.sweeps.{sweep}.key': {key!r} is not a run setting; "
                              f"known: {sorted(unlearning['defaults'])}")
        settings = {**unlearning["defaults"], **unlearning["runs"][base]}
        if key not in settings_read(settings["method"], settings["optimiser"]):
            raise ConfigError(f"config key 'unlearning.sweeps.{sweep}.key': run {base!r} (method "
                              f"{settings['method']!r}, optimiser {settings['optimiser']!r}) does not read {key!r}; "
                              "its points would be one job under several names")
        current = settings[key]
        if key == "anchor_tau" and current is None:  # null: the selection stage's tau
            current = config["selection"]["anchor"]["tau"]
        out[sweep] = [(value, base if value == current else f"{base}.{key}_{value}", key, base)
                      for value in spec["values"]]
    return out


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a YAML config, apply nested ``overrides``, validate and fill defaults."""
    config = yaml.safe_load(Path(path).read_text()) or {}
    if overrides:
        config = deep_update(config, overrides)
    return validate_config(config)


def deep_update(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def config_hash(obj: Any, length: int = 10) -> str:
    """Short stable hash of a JSON-serialisable config fragment (key order does not matter)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def run_setting_specs() -> dict:
    """The schema's run settings (``unlearning.defaults``): name -> its schema node (type, default, description)."""
    return load_schema()["properties"]["unlearning"]["properties"]["defaults"]["properties"]


@functools.lru_cache(maxsize=1)
def run_setting_names() -> frozenset[str]:
    """Every run setting the schema knows, those without a default included."""
    return frozenset(run_setting_specs())


def run_config(config: dict, name: str) -> dict:
    """The full settings of unlearning run ``name``: ``unlearning.defaults`` overridden by the run's own keys."""
    unlearning = config["unlearning"]
    if name not in unlearning["runs"]:
        raise ConfigError(f"unlearning run {name!r} is not in unlearning.runs ({', '.join(unlearning['runs'])})")
    known = run_setting_names() | set(unlearning["defaults"])
    unknown = set(unlearning["runs"][name]) - known
    if unknown:
        raise ConfigError(f"config key 'unlearning.runs.{name}': unknown setting(s) {sorted(unknown)}; "
                          f"known: {sorted(known)}")
    return resolve_run_settings({**unlearning["defaults"], **unlearning["runs"][name]})


@functools.lru_cache(maxsize=1)
def run_setting_reads() -> dict:
    """The schema's declaration of the run settings each part of an unlearning job reads (``x-reads`` of
    ``unlearning.defaults``: ``job``, ``training``, ``workflow``, one entry per method and per optimiser)."""
    return load_schema()["properties"]["unlearning"]["properties"]["defaults"]["x-reads"]


def _declared(kind: str, name: str) -> dict:
    entries = run_setting_reads()[kind]
    if name not in entries:
        raise ConfigError(f"{kind[:-1]} {name!r} declares no run settings: add its entry to x-reads.{kind} of "
                          f"unlearning.defaults in {SCHEMA_PATH}")
    return entries[name]


def _entry_reads(kind: str, name: str) -> frozenset[str]:
    entry = _declared(kind, name)
    inherited = _entry_reads(kind, entry["extends"]) if "extends" in entry else frozenset()
    return inherited | frozenset(entry.get("reads", ()))


def method_trains(method: str) -> bool:
    """Whether a method trains with an optimiser (false: a closed-form edit, which reads no optimiser setting)."""
    return _declared("methods", method).get("trains", True)


def settings_read(method: str, optimiser: str | None = None) -> frozenset[str]:
    """Every run setting an unlearning job of ``method`` with ``optimiser`` reads, as the schema declares it: the
    job's own, the method's, and for a training method the run loop's and the optimiser's."""
    reads = frozenset(run_setting_reads()["job"]) | _entry_reads("methods", method)
    if not method_trains(method):
        return reads
    if optimiser is None:
        raise ConfigError(f"method {method!r} trains: its settings need an 'optimiser'")
    return reads | frozenset(run_setting_reads()["training"]) | _entry_reads("optimisers", optimiser)


def job_settings(settings: dict) -> dict:
    """The run settings its unlearning job reads (``settings_read``), as the job's params: a setting no part of the
    job reads never reruns it. A setting without a default (e.g. ``precision``) stays absent when unset."""
    read = settings_read(settings["method"], settings.get("optimiser"))
    return {key: value for key, value in settings.items() if key in read}


def job_run_settings(config: dict, name: str) -> dict:
    """The params of run ``name``'s unlearning jobs: ``run_config`` narrowed to what they read (``job_settings``)."""
    return job_settings(run_config(config, name))


def setting_readers() -> dict[str, list[str]]:
    """Run setting -> who reads it, as the schema declares it (``x-reads``): every job, every training run, the
    rules, or the methods and optimisers whose entries list it (``extends`` followed); for the configuration
    reference."""
    reads, out = run_setting_reads(), {name: [] for name in run_setting_names()}
    for part, who in (("job", "every run"), ("training", "every training run"), ("workflow", "the workflow rules")):
        for name in reads[part]:
            out[name].append(who)
    for kind in ("methods", "optimisers"):
        for entry in reads[kind]:
            for name in sorted(_entry_reads(kind, entry)):
                out[name].append(f"{kind[:-1]} `{entry}`")
    return out


class DeclaredSettings(dict):
    """Run settings narrowed to those declared for their reader (``x-reads``): reading any other, by ``[]`` or
    ``get``, raises a KeyError naming the declaration to extend, so that a job never silently runs on a default
    it was not given."""

    def __init__(self, settings: dict, declared: frozenset[str], reader: str):
        super().__init__({key: value for key, value in settings.items() if key in declared})
        self.declared, self.reader = declared, reader

    def __missing__(self, key: str):
        raise KeyError(self._why(key))

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self.declared:
            raise KeyError(self._why(key))
        return super().get(key, default)

    def _why(self, key: str) -> str:
        if key in self.declared:
            return f"{self.reader} reads run setting {key!r}, which its settings lack"
        return (f"{self.reader} reads run setting {key!r}, which its declaration does not list: add it to the "
                f"entry's reads in x-reads of unlearning.defaults ({SCHEMA_PATH})")


def method_settings(method: str, settings: dict) -> DeclaredSettings:
    """The settings an unlearning method's object reads: the job's and its own entry's."""
    declared = frozenset(run_setting_reads()["job"]) | _entry_reads("methods", method)
    return DeclaredSettings(settings, declared, f"method {method!r}")


def run_loop_settings(method: str, settings: dict) -> DeclaredSettings:
    """The settings the run loop and the optimiser of a run of ``method`` read (``settings_read``)."""
    return DeclaredSettings(settings, settings_read(method, settings.get("optimiser")),
                            f"the run of method {method!r} with optimiser {settings.get('optimiser')!r}")


PIU_WEIGHT_DECAY = 0.01  # PIU's AdamW weight decay, the base step of every optimiser but epsilon_constrained
ADAMW_BETAS = [0.9, 0.999]  # PyTorch's AdamW betas: the base step of every optimiser but epsilon_constrained
EPSILON_CONSTRAINED_BETAS = [0.9, 0.95]  # epsilon-constrained paper, Appendix E.1: AdamW with beta = (0.90, 0.95)


def resolve_run_settings(settings: dict) -> dict:
    """Fill in the run settings whose default depends on the run (schema default null): ``weight_decay`` 0 and
    ``betas`` (0.9, 0.95) for the epsilon-constrained optimiser (its paper, Appendix E.1: AdamW with these betas and
    no weight decay), PIU's 0.01 and AdamW's (0.9, 0.999) otherwise; ``eupmu_alpha`` the run's ``lr`` (EUPMU
    Algorithm 1: alpha_t is the step size)."""
    resolved = dict(settings)
    constrained = resolved["optimiser"] == "epsilon_constrained"
    if resolved.get("weight_decay") is None:
        resolved["weight_decay"] = 0.0 if constrained else PIU_WEIGHT_DECAY
    if resolved.get("betas") is None:
        resolved["betas"] = list(EPSILON_CONSTRAINED_BETAS if constrained else ADAMW_BETAS)
    if resolved.get("eupmu_alpha") is None:
        resolved["eupmu_alpha"] = resolved["lr"]
    return resolved
