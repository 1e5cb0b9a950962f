import pandas as pd

from idunlearn.audit.verification import calibrate
from idunlearn.faces.analyser import ok_embeddings
from idunlearn.io import write_json
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "calibrate_verification") as log:
    p = snakemake.params.verification
    embeddings = ok_embeddings(pd.read_parquet(snakemake.input.faces))
    labels = pd.read_parquet(snakemake.input.labels).set_index("image_id").loc[embeddings.index, "identity"]
    record = calibrate(embeddings.tolist(), labels.to_numpy(), p["far"], p["heldout_fraction"], p["seed"])
    log.info("tau %.4f: FAR %.4f on %d calibration pairs, %.4f on %d held-out pairs", record["tau"],
             record["far_calibration"], record["n_pairs_calibration"], record["far_heldout"],
             record["n_pairs_heldout"])
    write_json(record, snakemake.output[0])
