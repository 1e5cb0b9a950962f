from pathlib import Path

from idunlearn.audit.heldout import mark_trained_against, trained_against
from idunlearn.audit.relearning_worstcase import worstcase_cells
from idunlearn.audit.tables import audit_table, job_rows
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
    # the worst-case protocol's cells beside retrain's, trained-against cells marked as in the audit's tables
    cells = worstcase_cells(mark_trained_against(audit_table([job_rows(f) for f in i.worstcase]),
                                                 trained_against(p.training, p.probes)),
                            p.reference) if i.worstcase else None
    curve, targets = rebuild_tables(dict(zip(models, map(read_json, i.ledgers))), metrics, p.compare_to, p.seed,
                                    cells)
    write_csv(curve, out.curve)
    write_csv(targets, out.targets)
    rebuild_curve(curve, out.figure)
