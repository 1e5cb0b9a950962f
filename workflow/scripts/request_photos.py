import torch

from idunlearn.faces import build_face_analyser
from idunlearn.io import write_parquet
from idunlearn.request.photos import embed_photos
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], "request_photos") as log:
    torch.set_num_threads(snakemake.threads)
    faces = snakemake.params.faces
    photos = embed_photos(snakemake.input.folder, build_face_analyser(faces, snakemake.input.models),
                          faces["batch_size"])
    # a person of a request for several people: their files named '<person>/<file>', unique across the folders
    photos["image_id"] = snakemake.params.person + photos["image_id"]
    log.info("status counts: %s", photos["status"].value_counts().to_dict())
    write_parquet(photos, snakemake.output.photos)
