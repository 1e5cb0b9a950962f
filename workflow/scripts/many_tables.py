import pandas as pd

from idunlearn.io import read_json, write_csv, write_parquet
from idunlearn.many import job_table, order_summary, plot_sizes, strategy_comparisons, strategy_table
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "many_tables") as log:
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    tau = read_json(i.verification)["tau"]
    before = pd.concat([pd.read_parquet(path).assign(forget_identity=identity)
                        for identity, path in zip(p.before, i.before)], ignore_index=True)
    table = pd.concat([job_table(job["strategy"], job["order"], job["size"], job["identities"],
                                 pd.read_parquet(job["samples"]), before, [read_json(t) for t in job["timings"]], tau)
                       for job in p.jobs], ignore_index=True)
    table.insert(0, "run", p.run)
    log.info("\n%s", table.to_string(index=False))
    summary = order_summary(table)
    strategies, comparisons = strategy_table(summary), strategy_comparisons(table, summary, p.seed)
    log.info("\n%s\n%s", strategies.to_string(index=False), comparisons.to_string(index=False))
    sequential = table["strategy"].str.startswith("sequential/")
    write_parquet(table[table["strategy"] == "joint"], out.joint)
    write_csv(table[table["strategy"] == "joint"], out.joint_csv)
    write_parquet(table[sequential], out.sequential)
    write_csv(table[sequential], out.sequential_csv)
    write_csv(table[table["strategy"].str.startswith("merge/")], out.merge_csv)
    write_csv(strategies, out.strategies_csv)
    write_csv(comparisons, out.comparisons_csv)
    plot_sizes(table[~sequential], out.joint_plot, "identities forgotten at once (N)")
    plot_sizes(table[sequential], out.sequential_plot, "chain step i (identities forgotten so far)")
