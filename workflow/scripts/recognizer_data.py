from idunlearn.recognizer import stages
from idunlearn.runlog import stage_log

with stage_log(snakemake.log[0], f"recognizer_{snakemake.rule}") as log:
    p = snakemake.params
    if snakemake.rule == "recognizer_orl_data":
        i = snakemake.input
        data = stages.orl_data(i.manifest, i.embeddings, i.labels, p.dataset, p.orl, p.seed)
    else:
        data = stages.fashion_mnist_data(p.fashion_mnist, p.data_dir, p.seed)
    data.save(snakemake.output[0])
