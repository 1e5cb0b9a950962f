import pandas as pd

from idunlearn.io import write_csv, write_json, write_parquet
from idunlearn.request.photos import find_requester, status_table
from idunlearn.request.selection import request_selections
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "request_selection") as log:
    i, p, out = snakemake.input, snakemake.params, snakemake.output
    several = len(p.people) > 1  # then each folder must show its person alone
    people = {person: find_requester(pd.read_parquet(path), p.identities["eps"], p.identities["min_samples"],
                                     p.request["min_photos"], one_person=several)
              for person, path in zip(p.people, i.photos, strict=True)}
    selections = dict(zip(p.people, request_selections(people, pd.read_parquet(i.centroids), p.selection,
                                                       p.identities["eps"], p.seed, p.anchor_tau)))
    photos, selection = people[p.person], selections[p.person]
    log.info("requester %r: %d photos; in the training data: %s (nearest identity %d at cosine %.3f); anchor %d",
             p.person, photos["used"].sum(), selection["in_training_data"], selection["nearest_identity"],
             selection["nearest_cosine"], selection["anchor_identity"])
    write_parquet(photos, out.photos)
    write_csv(status_table(photos), out.status)
    write_json(selection, out.selection)
