from pathlib import Path

import pandas as pd

from idunlearn.io import atomic_path, write_csv, write_json
from idunlearn.runlog import stage_log
from idunlearn.tuning import choice_record, choose, score_settings, tuning_markdown


def samples_of(paths) -> pd.DataFrame:
    """Per-sample tables of several tuning identities (the folder name is the identity), concatenated."""
    return pd.concat([pd.read_parquet(p).assign(forget_identity=int(Path(p).parent.name)) for p in paths],
                     ignore_index=True)


with stage_log(snakemake.log[0], "tune_choose") as log:
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    after = {name: samples_of([f for f in i.after if Path(f).parent.parent.name == name]) for name in p.settings}
    before = samples_of(i.before)
    table, choices = choose(score_settings(before, after, p.settings), p.rule, p.success)
    identities = sorted(before["forget_identity"].unique())
    log.info("\n%s\nchoices: %s", table.to_string(index=False), choices)
    write_csv(table, out.grid)
    with atomic_path(out.report) as tmp:
        tmp.write_text(tuning_markdown(table, choices, p.rule, p.success, identities))
    write_json(choice_record(choices, p.settings, p.rule, identities), out.choice)
