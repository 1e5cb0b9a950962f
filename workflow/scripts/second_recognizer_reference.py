import pandas as pd
import torch

from idunlearn.audit.second_recognizer import reference_centroids, reference_descriptors
from idunlearn.audit.verification import calibrate
from idunlearn.experiment import load_generator
from idunlearn.faces.dlib_descriptor import DlibDescriptor
from idunlearn.io import write_json, write_parquet
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "second_recognizer_reference") as log:
    torch.set_num_threads(snakemake.threads)
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    descriptor = DlibDescriptor(i.models, p.second["mode"])
    reference = reference_descriptors(descriptor, load_generator(p.generator), pd.read_parquet(i.manifest),
                                      pd.read_parquet(i.faces), pd.read_parquet(i.labels))
    found = reference[reference["detected"]]
    v = p.verification
    record = calibrate(found["embedding"].tolist(), found["identity"].to_numpy(), v["far"], v["heldout_fraction"],
                       v["seed"])
    log.info("%s: %d of %d real faces described; tau %.4f, FAR %.4f on %d held-out pairs", descriptor.name,
             len(found), len(reference), record["tau"], record["far_heldout"], record["n_pairs_heldout"])
    write_parquet(reference_centroids(reference), out.centroids)
    write_json({**record, "recognizer": descriptor.name, "described": int(len(found)), "faces": int(len(reference))},
               out.verification)
