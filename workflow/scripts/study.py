import pandas as pd

from idunlearn.io import atomic_path, write_csv, write_parquet
from idunlearn.runlog import stage_log
from idunlearn.study import build_study, check_claims, claims_markdown, identities_in

with stage_log(snakemake.log[0], "study") as log:
    out, config = snakemake.output, snakemake.params.config
    metrics, counts = pd.read_parquet(snakemake.input.metrics), pd.read_parquet(snakemake.input.counts)
    tables = build_study(metrics, counts, config)
    for (name, table), csv, parquet in zip(tables.items(), out.tables, out.parquet):
        write_csv(table, csv)
        write_parquet(table, parquet)
    claims = check_claims(tables, metrics, counts, config["seed"])
    log.info("\n%s", claims.to_string())
    write_csv(claims, out.claims_csv)
    with atomic_path(out.claims) as tmp:
        tmp.write_text(claims_markdown(claims, identities_in(metrics)))
