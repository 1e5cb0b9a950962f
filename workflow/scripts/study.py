import pandas as pd

from idunlearn.io import atomic_path, write_csv, write_parquet
from idunlearn.runlog import stage_log
from idunlearn.study import build_study, check_claims, claims_markdown, identities_in

with stage_log(snakemake.log[0], "study") as log:
    out = snakemake.output
    metrics = pd.read_parquet(snakemake.input.metrics)
    tables = build_study(metrics, snakemake.params.config)
    for (name, table), csv, parquet in zip(tables.items(), out.tables, out.parquet):
        write_csv(table, csv)
        write_parquet(table, parquet)
    claims = check_claims(tables)
    log.info("\n%s", claims.to_string())
    write_csv(claims, out.claims_csv)
    with atomic_path(out.claims) as tmp:
        tmp.write_text(claims_markdown(claims, identities_in(metrics)))
