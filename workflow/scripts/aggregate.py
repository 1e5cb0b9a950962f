from pathlib import Path

import pandas as pd

from idunlearn.evaluation.aggregate import job_seconds, job_seconds_measure, metrics_row, nested_markdown, summarise, summary_long, summary_markdown
from idunlearn.evaluation.metrics import METRIC_KEYS
from idunlearn.evaluation.statistics import sample_counts
from idunlearn.io import atomic_path, read_json, write_csv, write_parquet
from idunlearn.runlog import stage_log

SAMPLE_COLUMNS = ["kind", "target_identity", "predicted_identity"]


def counts_by_folder(paths) -> dict:
    """Evaluation folder -> ``sample_counts`` of its per-sample table (samples.parquet sits beside metrics.json)."""
    return {Path(p).parent: sample_counts(pd.read_parquet(p, columns=SAMPLE_COLUMNS)) for p in paths}


with stage_log(snakemake.log[0], "aggregate") as log:
    i, out, runs = snakemake.input, snakemake.output, snakemake.params.runs
    selections = pd.read_parquet(i.selections).set_index("forget_identity", drop=False)
    before, before_counts, folder_counts = {}, {}, counts_by_folder(
        [*i.before_samples, *i.after_samples, *i.external_samples])
    for path in i.before:
        metrics = read_json(path)
        before[metrics["forget_identity"]] = metrics
        before_counts[metrics["forget_identity"]] = folder_counts[Path(path).parent]
    rows, costs, counts = [], [], []
    # unlearning runs: settings and anchor from the job's timings; external models (evaluation.external, named by
    # their folder): the UNet's source as their only setting, the selection's anchor, no cost
    jobs = [(timings["run_name"], a, timings) for a, timings in zip(i.after, map(read_json, i.timings))]
    jobs += [(Path(a).parent.parent.name, a, None) for a in i.external]
    for run, after_path, timings in jobs:
        after = read_json(after_path)
        identity = after["forget_identity"]
        experiment = selections.loc[identity].to_dict()
        if timings is None:
            settings = {"external_unet": snakemake.params.external[run]}
        else:
            experiment.update(timings["anchor"])  # the run's own anchor
            # the settings the job ran with (a <run>.tuned run's chosen setting, a Phase II run's epsilon)
            settings = timings["run"]
            costs.append({"run": run, "forget_identity": identity,
                          **{k: timings[k] for k in ("steps", "trainable_parameters", "seconds_per_step")},
                          "unlearning_seconds": job_seconds(timings),
                          "seconds_measure": job_seconds_measure(timings)})
        rows.append({**metrics_row(run, settings, experiment, before[identity], after, METRIC_KEYS),
                     "kd_features": after["kd_features"], "quality_measure": after["quality_measure"]})
        for phase, c in (("before", before_counts[identity]), ("after", folder_counts[Path(after_path).parent])):
            counts.append({"run": run, "phase": phase, "forget_identity": identity, **c})
    metrics = pd.DataFrame(rows).sort_values(["run", "forget_identity"]).reset_index(drop=True)
    counts = pd.DataFrame(counts).sort_values(["run", "phase", "forget_identity"]).reset_index(drop=True)
    values = [c for c in metrics.columns if c.rsplit("_", 1)[-1] in ("before", "after", "delta")]
    summary = summarise(metrics, ["run"], values)
    long = summary_long(metrics, counts, METRIC_KEYS, snakemake.params.seed)
    primary = next(iter(runs))
    identities = metrics.loc[metrics["run"] == primary, "forget_identity"].tolist()
    log.info("\n%s", long.to_string())
    write_parquet(metrics, out.metrics)
    write_csv(metrics, out.metrics_csv)
    write_parquet(counts, out.counts)
    write_parquet(summary, out.summary)
    write_csv(summary, out.summary_csv)
    write_csv(long, out.summary_long)
    audit = [nested_markdown(Path(p).read_text()) for p in i.audit]
    with atomic_path(out.summary_md) as tmp:
        tmp.write_text("\n".join([summary_markdown(long, primary, identities), *audit]))
    write_csv(pd.DataFrame(costs).sort_values(["run", "forget_identity"]), out.costs)
