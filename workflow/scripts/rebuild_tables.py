from pathlib import Path

from idunlearn.io import read_json, write_csv
from idunlearn.pictures import rebuild_curve
from idunlearn.rebuild_tables import metrics_table, rebuild_tables
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], snakemake.rule):
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    models = list(p.models)
    # evaluation/external/<model>/<identity>/metrics.json
    files = {model: [f for f in i.rebuilt if Path(f).parts[-3] == model] for model in models}
    metrics = metrics_table({**files, p.reference: list(i.reference), p.compare_to: list(i.compared)})
    curve, targets = rebuild_tables(dict(zip(models, map(read_json, i.ledgers))), metrics, p.compare_to, p.seed)
    write_csv(curve, out.curve)
    write_csv(targets, out.targets)
    rebuild_curve(curve, out.figure)
