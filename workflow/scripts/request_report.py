import pandas as pd

from idunlearn.io import atomic_path, read_json
from idunlearn.request.report import request_report, to_markdown, to_rst
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "request_report") as log:
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    sections = request_report(p.name, p.folder, pd.read_csv(i.status, keep_default_na=False), read_json(i.selection),
                              p.run_name, p.run, (read_json(i.before_metrics), read_json(i.after_metrics)),
                              (pd.read_parquet(i.before_rows), pd.read_parquet(i.after_rows)),
                              read_json(i.verification), read_json(i.manifest))
    for path, text in ((out.markdown, to_markdown(sections)), (out.rst, to_rst(sections))):
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    log.info("report: %s", out.markdown)
