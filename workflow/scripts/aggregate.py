import pandas as pd

from idunlearn.evaluation.aggregate import metrics_row, summarise
from idunlearn.evaluation.metrics import METRIC_KEYS
from idunlearn.io import read_json, write_csv, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "aggregate") as log:
    i, out, runs = snakemake.input, snakemake.output, snakemake.params.runs
    selections = pd.read_parquet(i.selections).set_index("forget_identity", drop=False)
    before = {m["forget_identity"]: m for m in map(read_json, i.before)}
    rows, costs = [], []
    for after_path, timings_path in zip(i.after, i.timings):
        after, timings = read_json(after_path), read_json(timings_path)
        run, identity = timings["run_name"], after["forget_identity"]
        experiment = {**selections.loc[identity].to_dict(), **timings["anchor"]}  # the run's own anchor
        rows.append({**metrics_row(run, runs[run], experiment, before[identity], after, METRIC_KEYS),
                     "kd_features": after["kd_features"], "quality_measure": after["quality_measure"]})
        costs.append({"run": run, "forget_identity": identity,
                      **{k: timings[k] for k in ("steps", "trainable_parameters", "seconds_per_step")}})
    metrics = pd.DataFrame(rows).sort_values(["run", "forget_identity"]).reset_index(drop=True)
    values = [c for c in metrics.columns if c.rsplit("_", 1)[-1] in ("before", "after", "delta")]
    summary = summarise(metrics, ["run"], values)
    log.info("\n%s", summary.T.to_string())
    write_parquet(metrics, out.metrics)
    write_csv(metrics, out.metrics_csv)
    write_parquet(summary, out.summary)
    write_csv(summary, out.summary_csv)
    write_csv(pd.DataFrame(costs).sort_values(["run", "forget_identity"]), out.costs)
