import pandas as pd

from idunlearn.io import read_json, write_csv, write_parquet
from idunlearn.many import job_table, plot_joint, plot_sequential
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "many_tables") as log:
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    ids, tau = list(p.identities), read_json(i.verification)["tau"]
    before = pd.concat([pd.read_parquet(path).assign(forget_identity=identity) for identity, path in zip(ids, i.before)],
                       ignore_index=True)
    joint = pd.concat([job_table("joint", n, ids[:n], pd.read_parquet(samples), before, [read_json(timings)], tau)
                       for n, samples, timings in zip(p.joint_sizes, i.joint, i.joint_timings)], ignore_index=True)
    chain = [read_json(path) for path in i.sequential_timings]
    sequential = pd.concat([job_table("sequential", step, ids[:step], pd.read_parquet(samples), before, chain[:step],
                                      tau) for step, samples in enumerate(i.sequential, start=1)], ignore_index=True)
    for table, parquet, csv in ((joint, out.joint, out.joint_csv), (sequential, out.sequential, out.sequential_csv)):
        table.insert(0, "run", p.run)
        log.info("\n%s", table.to_string(index=False))
        write_parquet(table, parquet)
        write_csv(table, csv)
    plot_joint(joint, out.joint_plot)
    plot_sequential(sequential, out.sequential_plot)
