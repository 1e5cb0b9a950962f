import pandas as pd

from idunlearn.io import read_json
from idunlearn.pictures import identity_sheet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "identity_sheet"):
    identity_sheet(read_json(snakemake.input.selection), pd.read_parquet(snakemake.input.labels),
                   pd.read_parquet(snakemake.input.manifest), snakemake.output[0])
