import pandas as pd

from idunlearn.io import atomic_path
from idunlearn.landing import landing_rst
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "landing_page"):
    i, p = snakemake.input, snakemake.params
    audit = pd.read_csv(i.audit_summary[0]) if i.audit_summary else None
    verdicts = pd.read_csv(i.verdicts[0]) if i.verdicts else None
    with atomic_path(snakemake.output[0]) as tmp:
        tmp.write_text(landing_rst(pd.read_csv(i.summary_long), dict(zip(p.runs, i.grids)), audit, verdicts,
                                   p.identities))
