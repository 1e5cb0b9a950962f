# Config getters of the many stage (rules/many.smk).

from idunlearn.config import job_settings, tuned_base
from idunlearn.many import (CLOSED_FORM_MERGES, MERGES, PROTECTIONS, evaluated_steps, identity_orders, joint_run,
                            merge_names, merge_sizes, step_run)
from idunlearn.unlearning import METHODS


wildcard_constraints:
    n=r"[2-9]|[1-9]\d+",  # N = 1 and step 1 are the single job (many_unlearn_single)
    step=r"[2-9]|[1-9]\d+",
    order=r"\d+",
    protection="|".join(PROTECTIONS),
    merge="|".join(MERGES),


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
    joint = max(cfg["joint_sizes"]) > 1 or set(cfg["sequential_protections"]) - {"none"}
    if joint and not METHODS[run["method"]].joint:
        raise ValueError(f"config key 'many.joint_sizes': method {run['method']!r} of run {cfg['run']!r} unlearns one "
                         "identity per run; use joint_sizes: [1] and sequential_protections: [none] (the chain still "
                         "runs) or a run of piu, esd, siss or uce")
    cfg["merges"] = merge_names(cfg["merges"])
    return cfg


def many_orders():
    """The many stage's identity orders (known after the many_select checkpoint)."""
    order = pd.read_parquet(checkpoints.many_select.get().output.order)["forget_identity"].astype(int).tolist()
    return identity_orders(many_settings(), order, config["seed"])


def many_order_ids(wildcards):
    return many_orders()[int(wildcards.order)]


def many_order(wildcards):
    """The checkpoint's order table: an input of every job whose params read many_orders()."""
    return checkpoints.many_select.get().output.order


def many_selection_path(identity):
    """An identity's ordinary selection (the selection stage's experiment, written by the checkpoint)."""
    return os.path.join(checkpoints.many_select.get().output.identities, f"{identity}.json")


def many_selection_file(wildcards):
    return many_selection_path(wildcards.identity)


def many_joint_run(wildcards):
    """A joint job's settings: the run's job settings with the budget grown with N (many.joint_budget)."""
    return joint_run(job_run_settings(config, wildcards.run), int(wildcards.n), many_settings()["joint_budget"])


def many_step_run(wildcards):
    """A chain step's settings and its identities' forget-batch weights (idunlearn.many.step_run)."""
    run, weights = step_run(run_config(config, wildcards.run), wildcards.protection, int(wildcards.step),
                            many_settings()["replay_batch"])
    return job_settings(run), None if weights is None else weights.tolist()


def many_single(output, identity, run=None):
    return expand(output, run=run or many_settings()["run"], identity=identity)[0]


def many_step_previous(wildcards):
    """Step i > 2 starts from step i-1's weights, step 2 from the single job of the order's first identity."""
    step = int(wildcards.step)
    if step == 2:
        return many_single(rules.many_unlearn_single.output.changed, many_order_ids(wildcards)[0], wildcards.run)
    return expand(rules.many_unlearn_step.output.changed, run=wildcards.run, order=wildcards.order,
                  protection=wildcards.protection, step=step - 1)[0]


def many_merged(wildcards):
    """The single jobs a merge of N merges: those of the order's first N identities."""
    ids = many_order_ids(wildcards)[:int(wildcards.n)]
    return {"changed": [many_single(rules.many_unlearn_single.output.changed, i, wildcards.run) for i in ids],
            "timings": [many_single(rules.many_unlearn_single.output.timings, i, wildcards.run) for i in ids],
            "selections": [many_selection_path(i) for i in ids]}


def many_table_jobs():
    """Every evaluated job of the tables, in table order: strategy, order, size, identities, its evaluation samples
    and the timings of every job it took (a chain step: the chain's up to it; a merge: its single jobs and itself).
    Size 1 of every strategy is the single job of the order's first identity."""
    cfg = many_settings()
    jobs = []
    for k, ids in enumerate(many_orders()):

        def single(strategy):
            return {"strategy": strategy, "order": k, "size": 1, "identities": ids[:1],
                    "samples": many_single(rules.many_evaluate_single.output.samples, ids[0]),
                    "timings": [many_single(rules.many_unlearn_single.output.timings, ids[0])]}

        def job(strategy, size, samples, timings):
            return {"strategy": strategy, "order": k, "size": size, "identities": ids[:size], "samples": samples,
                    "timings": timings}

        wc = {"run": cfg["run"], "order": k}
        for n in sorted(cfg["joint_sizes"]):
            jobs.append(single("joint") if n == 1 else job(
                "joint", n, expand(rules.many_evaluate_joint.output.samples, n=n, **wc)[0],
                expand(rules.many_unlearn_joint.output.timings, n=n, **wc)))
        for protection in cfg["sequential_protections"]:
            chain = [many_single(rules.many_unlearn_single.output.timings, ids[0])]
            chain += expand(rules.many_unlearn_step.output.timings, protection=protection,
                            step=range(2, cfg["sequential_length"] + 1), **wc)
            for step in evaluated_steps(cfg):
                strategy = f"sequential/{protection}"
                jobs.append(single(strategy) if step == 1 else job(
                    strategy, step, expand(rules.many_evaluate_step.output.samples, protection=protection,
                                           step=step, **wc)[0], chain[:step]))
        for merge in cfg["merges"]:
            for n in merge_sizes(cfg):
                singles = [many_single(rules.many_unlearn_single.output.timings, i) for i in ids[:n]]
                jobs.append(job(f"merge/{merge}", n,
                                expand(rules.many_evaluate_merge.output.samples, merge=merge, n=n, **wc)[0],
                                [*singles, *expand(rules.many_merge.output.timings, merge=merge, n=n, **wc)]))
    return jobs
