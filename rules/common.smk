# Config access and getters shared by every stage.

import os

import pandas as pd

from idunlearn.audit.heldout import training_attacks
from idunlearn.config import (controllable_runs, epsilon_boundary_runs, job_run_settings, job_settings, run_config,
                              tuned_base, validate_config)
from idunlearn.models.export import unet_folder_files, unet_source_files
from idunlearn.tuning import tuning_settings

# Validates the config against the package's JSON schema and fills in defaults; errors name the bad key.
validate_config(config)


wildcard_constraints:
    identity=r"\d+",
    run=r"[A-Za-z0-9_.-]+",
    external=r"[A-Za-z0-9_.-]+",

DATA = config["data_dir"]
RESULTS = config["results_dir"]
ASSETS = os.path.join(DATA, "assets")
JOB_THREADS = config["job_threads"]  # threads of each per-(run, identity) job: see the schema


def results(*parts):
    return os.path.join(RESULTS, *parts)


def logs(name):
    return os.path.join(RESULTS, "logs", f"{name}.log")


def face_models_dir():
    return os.path.join(DATA, "models", "faces", config["faces"]["backend"])


def generator_files():
    """The shipped/trained mini generator checkpoint (the Arc2Face backend loads from the hub instead)."""
    if config["generator"]["backend"] != "mini":
        return []
    folder = config["generator"]["mini"]["checkpoint"]
    return [os.path.join(folder, "model.safetensors"), os.path.join(folder, "config.json")]


def evaluation_settings():
    """The evaluation section as the evaluation jobs' params: without ``external`` (which models are evaluated is no
    setting of a job), so that adding an external model leaves every cached evaluation and audit job valid."""
    return {key: value for key, value in config["evaluation"].items() if key != "external"}


def quality_model():
    """The eDifFIQA ONNX file when configured (its change re-evaluates); none for the offline proxy."""
    path = config["evaluation"]["quality"]["ediffiqa_onnx"]
    return [path] if path else []


def image_dir():
    return os.path.join(DATA, "images", config["dataset"]["source"])


def forget_identities(wildcards=None):
    """Forget identity ids chosen by the select_experiments checkpoint (known only after it ran)."""
    table = checkpoints.select_experiments.get().output.table
    return [int(i) for i in pd.read_parquet(table)["forget_identity"]]


def reference_excluded_identities(wildcards=None):
    """Identity ids the never-trained reference (train_generator_reference) never sees."""
    exclude = config["generator"]["reference"]["exclude_identities"]
    return forget_identities() if exclude == "selection" else [int(i) for i in exclude]


def reference_selection(wildcards):
    """The selection table, when the reference excludes the selection's forget identities."""
    if config["generator"]["reference"]["exclude_identities"] != "selection":
        return []
    return checkpoints.select_experiments.get().output.table


def selection_file(wildcards):
    """The per-identity selection file; asking for it waits for the select_experiments checkpoint."""
    folder = checkpoints.select_experiments.get().output.identities
    return os.path.join(folder, f"{wildcards.identity}.json")


def get_final_outputs(wildcards):
    if request_active():  # a config with a forget request serves that request (rules/request.smk)
        return request_outputs()
    identities = forget_identities()
    return [
        results("identities", "summary.csv"),
        results("identities", "nn_histogram.png"),
        results("selection", "selections.csv"),
        results("tables", "metrics.csv"),
        results("tables", "summary.csv"),
        results("tables", "landing.rst"),  # the report's landing page
        results("analysis", "layer_separation.png"),
        *expand(results("selection", "sheets", "{identity}.png"), identity=identities),
        *[results("figures", run, f"{identity}_{kind}.png") for run, identity in run_identity_pairs()
          for kind in ("forget", "retain")],
        *([results("tables", "study", "claims.md")] if config["study"] else []),
        *([results("figures", "pareto.png")] if config["unlearning"]["controllable"] else []),
        *([results("tables", "audit_summary.md")] if config["audit"]["default_target"] else []),
    ]


def landing_grids():
    """(run, identity) of the forget grid each run shows on the report's landing page: its first forget identity."""
    first = {}
    for run, identity in run_identity_pairs():
        first.setdefault(run, identity)
    return list(first.items())


def audit_tables_if_default(name):
    """An audit_tables output, when the audit is in the default target (else the landing page has no audit)."""
    return [getattr(rules.audit_tables.output, name)] if config["audit"]["default_target"] else []


def audited_pairs():
    """(run, forget identity) of every unlearning job the audit covers (config ``audit.runs``; null: all)."""
    return [(run, identity) for run, identity in run_identity_pairs() if audited(run)]


def audited_external_pairs():
    """(external model, forget identity) of every external model the audit covers (config ``audit.runs``)."""
    return [(name, identity) for name, identity in external_identity_pairs() if audited(name)]


def audited_runs():
    """The audited unlearning runs, compare_to first (the audit's evaluation summary speaks of the first)."""
    reference = config["audit"]["compare_to"]
    return sorted((run for run in run_names() if audited(run)), key=lambda run: run != reference)


def audited_identities():
    """Forget identities with at least one audited run or external model."""
    return sorted({identity for _, identity in audited_pairs() + audited_external_pairs()})


def audited(name):
    runs = config["audit"]["runs"]
    unknown = sorted(set(runs or []) - set(run_names()) - set(external_models()))
    if unknown:
        raise ValueError(f"config key 'audit.runs': unknown run(s) {unknown}; known: {run_names()} and the "
                         f"external models {list(external_models())}")
    return runs is None or name in runs


def audit_probes(wildcards):
    """An audit job's probes (config ``audit.probes``) without the worst-case relearning protocol, which runs as jobs
    of its own (rule audit_worstcase), so that turning it on reruns no cached audit job."""
    probes = config["audit"]["probes"]
    if "relearning_worstcase" not in probes:
        return probes
    return {name: cfg for name, cfg in probes.items() if name != "relearning_worstcase"}


def worstcase_settings(wildcards):
    """The worst-case relearning protocol's settings for one forget identity: the first ``spread_identities``
    forget identities get ``spread_seeds`` seeds, the others ``seeds``."""
    cfg = config["audit"]["probes"]["relearning_worstcase"]
    spread = int(wildcards.identity) in forget_identities()[:cfg["spread_identities"]]
    return {**cfg, "seeds": cfg["spread_seeds"] if spread else cfg["seeds"]}


def audited_rows(rule, external_rule):
    """The rows file of ``rule`` for every audited (run, identity) and of ``external_rule`` for every audited
    (external model, identity)."""
    return ([expand(rule.output.rows, run=run, identity=identity)[0] for run, identity in audited_pairs()]
            + [expand(external_rule.output.rows, external=name, identity=identity)[0]
               for name, identity in audited_external_pairs()])


def worstcase_rows():
    """The worst-case relearning protocol's rows of every audited run and external model (none while it is off)."""
    if "relearning_worstcase" not in config["audit"]["probes"]:
        return []
    return audited_rows(rules.audit_worstcase, rules.audit_worstcase_external)


def attack_samples_rows():
    """The attack's rows with ``audit.attack_samples`` samples of every audited run and external model, which replace
    the audit jobs' attack rows (none while it is 0 or the attack is off)."""
    if not config["audit"]["attack_samples"] or "attack" not in config["audit"]["probes"]:
        return []
    return audited_rows(rules.audit_attack_samples, rules.audit_attack_samples_external)


def audited_training():
    """Audited run -> the attacks it trains against, from its settings (``audit.heldout.training_attacks``)."""
    return {name: training_attacks(config, name) for name in [*run_names(), *external_models()] if audited(name)}


def audit_reference():
    """The audited run every other audited run is compared with (config ``audit.compare_to``), or None."""
    reference = config["audit"]["compare_to"]
    if reference is not None and (reference not in [*run_names(), *external_models()] or not audited(reference)):
        raise ValueError(f"config key 'audit.compare_to': {reference!r} is not audited; add it to 'audit.runs' "
                         f"({config['audit']['runs']}) or set compare_to to one of them")
    return reference


def audit_pairs():
    """The further pairs [run, against] of audited runs (config ``audit.pairs``), each checked."""
    pairs = config["audit"]["pairs"]
    for run, against in pairs:
        if run == against or not all(name in [*run_names(), *external_models()] and audited(name)
                                     for name in (run, against)):
            raise ValueError(f"config key 'audit.pairs': [{run!r}, {against!r}] must name two different audited runs; "
                             f"audited: {config['audit']['runs']}")
    return pairs


def second_recognizer_models_dir():
    return os.path.join(DATA, "models", "second_recognizer", config["audit"]["second_recognizer"]["backend"] or "none")


def second_recognizer_inputs(wildcards):
    """The audit's second recognizer (its models and its reference of the real identities), when configured."""
    if config["audit"]["second_recognizer"]["backend"] is None:
        return {}
    return {"second_models": second_recognizer_models_dir(),
            "second_centroids": results("audit", "second_recognizer", "centroids.parquet"),
            "second_verification": results("audit", "second_recognizer", "verification.json")}


def run_names():
    return list(config["unlearning"]["runs"])


def epsilon_boundary_losses(wildcards):
    """A Phase II (controllable) run's epsilon comes from the same identity's two Phase I runs."""
    return [results("unlearning", run, wildcards.identity, "losses.parquet")
            for run in epsilon_boundary_runs(config, wildcards.run)]


def controllable_points():
    """Base run -> [(point, run name)] in order of decreasing completeness."""
    return {base: [(point, name) for point, name, _ in points] for base, points in controllable_runs(config).items()}


def controllable_losses():
    """Loss logs of every controllable run on its own identities (``run_identity_pairs``: a run's ``n_identities``)."""
    runs = {name for points in controllable_points().values() for _, name in points}
    return [results("unlearning", run, str(identity), "losses.parquet")
            for run, identity in run_identity_pairs() if run in runs]


def run_outputs(kind, pairs=None):
    """Paths of every run x forget identity (or of ``pairs``) for one output of the unlearning/evaluation stages."""
    pattern = {"metrics": rules.evaluate_unlearned.output.metrics, "samples": rules.evaluate_unlearned.output.samples,
               "timings": rules.unlearn.output.timings}[kind]
    return [expand(pattern, run=run, identity=identity)[0]
            for run, identity in (run_identity_pairs() if pairs is None else pairs)]


def run_identity_pairs():
    """(run, forget identity) of every unlearning job: a run with ``n_identities`` takes the first n identities."""
    identities = forget_identities()
    return [(run, identity) for run in run_names()
            for identity in identities[:run_config(config, run)["n_identities"] or len(identities)]]


def external_models():
    """Name -> entry of every model made elsewhere (config ``evaluation.external``), evaluated without unlearning."""
    return {entry["name"]: entry for entry in config["evaluation"]["external"]}


def external_model(wildcards):
    """An external model's files, its jobs' input: ``unet``, a UNet (a delta, or a diffusers folder's config and
    weights), or ``folder``, a whole mini generator's two files."""
    entry = external_models()[wildcards.external]
    if "unet" in entry:
        return {"unet": unet_source_files(entry["unet"])}
    folder = reference_generator_folder() if entry["generator"] == "reference" else entry["generator"]
    return {"folder": [os.path.join(folder, "model.safetensors"), os.path.join(folder, "config.json")]}


def reference_generator_folder():
    """The never-trained reference: generator.reference.checkpoint (shipped), or while that folder is absent the
    folder train_generator_reference writes (the workflow then trains it: about 80 minutes on 2 cores)."""
    shipped = config["generator"]["reference"]["checkpoint"]
    if os.path.isfile(os.path.join(shipped, "model.safetensors")):
        return shipped
    return results("generator", "reference")


def external_identity_pairs():
    """(external model, forget identity) of every external evaluation; the identities must be selected ones
    (``selection``: all of them; {first: n}: the first n, as an unlearning run's ``n_identities``)."""
    identities, pairs = forget_identities(), []
    for index, entry in enumerate(config["evaluation"]["external"]):
        if entry["identities"] == "selection" or isinstance(entry["identities"], dict):
            first = len(identities) if entry["identities"] == "selection" else entry["identities"]["first"]
            pairs += [(entry["name"], identity) for identity in identities[:first]]
            continue
        unknown = sorted(set(entry["identities"]) - set(identities))
        if unknown:
            raise ValueError(f"config key 'evaluation.external.{index}.identities': {unknown} are not forget "
                             f"identities of the selection {identities} ({results('selection', 'selections.csv')})")
        pairs += [(entry["name"], identity) for identity in entry["identities"]]
    return pairs


def external_outputs(kind, pairs=None):
    """Paths of every external model x identity (or of ``pairs``) for one output of evaluate_external."""
    pattern = {"metrics": rules.evaluate_external.output.metrics,
               "samples": rules.evaluate_external.output.samples}[kind]
    return [expand(pattern, external=name, identity=identity)[0]
            for name, identity in (external_identity_pairs() if pairs is None else pairs)]


def tuning_identities():
    """Tuning forget identity ids chosen by the tune_select checkpoint."""
    return [int(i) for i in pd.read_parquet(checkpoints.tune_select.get().output.table)["forget_identity"]]


def tuning_selection_file(wildcards):
    folder = checkpoints.tune_select.get().output.identities
    return os.path.join(folder, f"{wildcards.identity}.json")


def tuning_choice_input(wildcards):
    """A <run>.tuned run reads its settings from the tuning's choice (the unlearn script applies them)."""
    return [rules.tune_choose.output.choice] if tuned_base(wildcards.run) else []


def tune_tables(wildcards):
    """The tuning tables; an empty tuning.methods is a clear error."""
    if not config["tuning"]["methods"]:
        raise ValueError("config key 'tuning.methods' is empty: nothing to tune; declare grids there, or run "
                         "`snakemake tune --configfile config/study.yaml`")
    return rules.tune_choose.output


# --- forget requests (rules/request.smk) ---
REQUEST = config["request"]


def request_active():
    return REQUEST["folder"] is not None or bool(REQUEST["people"])


def request_people():
    """Each person of the request -> their folder, keyed by the prefix of their files under request_dir: '' for a
    one-person request (request.folder), '<person>/' for each of request.people."""
    if REQUEST["folder"] is not None and REQUEST["people"]:
        raise ValueError("config keys 'request.folder' and 'request.people' are both set: a request names one "
                         "person's folder or several people's, not both")
    if REQUEST["folder"] is not None:
        return {"": REQUEST["folder"]}
    return {f"{person}/": folder for person, folder in REQUEST["people"].items()}


def request_dir(*parts):
    return results("request", REQUEST["name"], *parts)


def request_person_files(name, *parts):
    """One file of every person of the request, in request.people's order."""
    return [request_dir(f"{person}{name}", *parts) for person in request_people()]


def request_run():
    """The settings its jobs read of the run named by request.run (``job_settings``), checked: a run whose settings
    come from other jobs cannot serve a request."""
    name = REQUEST["run"]
    if name not in run_names():
        raise ValueError(f"config key 'request.run': {name!r} is not in unlearning.runs {run_names()}")
    run = run_config(config, name)
    if run["epsilon_fraction"] is not None or tuned_base(name):
        raise ValueError(f"config key 'request.run': {name!r} takes its settings from other jobs (a Phase II or "
                         "tuned run); name a run with its own settings, e.g. piu")
    return job_settings(run)


def request_probes():
    """The light probes of request.probes with the audit's settings (config audit.probes)."""
    missing = sorted(set(REQUEST["probes"]) - set(config["audit"]["probes"]))
    if missing:
        raise ValueError(f"config key 'request.probes': {missing} are not enabled in audit.probes, which holds "
                         "their settings; enable them there")
    return {probe: config["audit"]["probes"][probe] for probe in REQUEST["probes"]}


def request_outputs():
    return [*(request_dir(f"{person}report{ext}") for person in request_people() for ext in (".md", ".rst")),
            request_dir("export", "manifest.json")]


def rebuild_run(name):
    """A rebuild run's settings (rebuild.defaults with its overrides)."""
    from idunlearn.rebuild import rebuild_settings

    return rebuild_settings(config["rebuild"], name)


def rebuild_settings_key(name):
    from idunlearn.rebuild import settings_key

    return settings_key(rebuild_run(name))


def rebuild_search_key(name):
    """The search a rebuild run reads: named by the hash of its search settings and seed."""
    from idunlearn.rebuild import search_key

    return search_key(rebuild_run(name))


def rebuild_search_settings(key):
    """The settings of the rebuild run(s) whose search is ``key``."""
    for name in config["rebuild"].get("runs") or {}:
        if rebuild_search_key(name) == key:
            return rebuild_run(name)
    raise ValueError(f"no rebuild run in config key 'rebuild.runs' has search {key!r}")


def rebuild_jobs():
    """(run, budget percent) of every rebuild job."""
    return [(name, budget) for name in (config["rebuild"].get("runs") or {})
            for budget in rebuild_run(name)["budgets"]]


def rebuild_previous_budget(wildcards):
    """The run's next smaller budget's model: its job leaves the training state this one resumes (never two at once)."""
    smaller = [b for b in rebuild_run(wildcards.name)["budgets"] if b < int(wildcards.budget)]
    if int(wildcards.budget) not in rebuild_run(wildcards.name)["budgets"]:
        raise ValueError(f"rebuild run {wildcards.name!r} has no budget {wildcards.budget}% (config "
                         f"'rebuild' budgets {rebuild_run(wildcards.name)['budgets']})")
    return {"previous": results("rebuild", wildcards.name, f"b{max(smaller)}", "model.safetensors")} if smaller else {}


def rebuild_worstcase_rows():
    """The worst-case relearning protocol's rows of every audited rebuilt model and the never-trained reference, on
    each one's evaluated identities (none while the protocol is off or no rebuilt model is audited); a rebuilt model
    left out of audit.runs has its worst-case targets untested."""
    audited_models = [name for name in rebuild_models() if audited(name)]
    if "relearning_worstcase" not in config["audit"]["probes"] or not audited_models:
        return []
    names = [*audited_models, config["audit"]["verdict"]["reference"]]
    return [expand(rules.audit_worstcase_external.output.rows, external=name, identity=identity)[0]
            for name, identity in external_identity_pairs() if name in names]


def rebuild_models():
    """External model name -> (rebuild run, budget) of every evaluation.external entry that loads a rebuild's output."""
    made = {os.path.normpath(results("rebuild", run, f"b{budget}")): (run, budget) for run, budget in rebuild_jobs()}
    return {entry["name"]: made[os.path.normpath(entry["generator"])] for entry in config["evaluation"]["external"]
            if os.path.normpath(entry.get("generator", "")) in made}
