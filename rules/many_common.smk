# Config getters of the many stage (rules/many.smk).

from idunlearn.config import tuned_base
from idunlearn.many import chosen_identities
from idunlearn.unlearning import METHODS


wildcard_constraints:
    n=r"\d+",
    step=r"\d+",


def many_settings():
    """The many section, checked: a declared run whose method can take the joint sizes."""
    cfg = config["many"]
    if cfg["run"] is None:
        raise ValueError("config key 'many.run' is null, so the many stage is off: name an unlearning run there, e.g. "
                         "`snakemake many --configfile config/config.yaml config/many.yaml`")
    if cfg["run"] not in run_names() or tuned_base(cfg["run"]):
        raise ValueError(f"config key 'many.run': {cfg['run']!r} is not a declared unlearning run (tuned runs are not "
                         f"supported); declared: {run_names()}")
    run = run_config(config, cfg["run"])
    if run["epsilon_fraction"] is not None:
        raise ValueError(f"config key 'many.run': {cfg['run']!r} is a Phase II controllable run, whose epsilon comes "
                         "from per-identity boundary runs; choose another run")
    if max(cfg["joint_sizes"]) > 1 and not METHODS[run["method"]].joint:
        raise ValueError(f"config key 'many.joint_sizes': method {run['method']!r} of run {cfg['run']!r} unlearns one "
                         "identity per run; use joint_sizes: [1] (the chain still runs) or a run of piu, esd, siss "
                         "or uce")
    return cfg


def many_identities():
    """The many stage's identities in order (known after the many_select checkpoint)."""
    order = pd.read_parquet(checkpoints.many_select.get().output.order)["forget_identity"].astype(int).tolist()
    return chosen_identities(many_settings(), order)


def many_order(wildcards):
    """The checkpoint's order table: an input of every job whose params read many_identities()."""
    return checkpoints.many_select.get().output.order


def many_step_previous(wildcards):
    """Step i > 1 starts from step i-1's weights; step 1 from the original generator."""
    step = int(wildcards.step)
    return [] if step == 1 else [results("many", wildcards.run, "sequential", f"step{step - 1}",
                                         "changed_parameters.safetensors")]


def many_job_files(output, mode):
    """One output of every joint job (mode joint) or chain step (sequential) of the configured run, in order."""
    cfg, wildcard = many_settings(), {"joint": "n", "sequential": "step"}[mode]
    sizes = sorted(cfg["joint_sizes"]) if mode == "joint" else range(1, cfg["sequential_length"] + 1)
    return [expand(output, run=cfg["run"], **{wildcard: size})[0] for size in sizes]
