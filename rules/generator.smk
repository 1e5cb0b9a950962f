# Stage "train generator": (re)build the mini Arc2Face on the embedded faces. Not part of the default target:
# the default run starts from the shipped checkpoint (generator.mini.checkpoint). Run `snakemake train_generator`.
# `snakemake train_generator_reference` trains the never-trained reference: the same recipe without the images of
# generator.reference.exclude_identities (by default every forget identity of the selection).


rule train_generator:
    input:
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        centroids=rules.cluster_identities.output.centroids,
        labels=rules.cluster_identities.output.labels,
        models=face_models_dir(),
    output:
        model=results("generator", "trained", "model.safetensors"),
        config=results("generator", "trained", "config.json"),
        history=results("generator", "trained", "history.parquet"),
    params:
        mini=config["generator"]["mini"],
        faces=config["faces"],
        exclude=[],
        state=results("generator", "train_state.pt"),
    threads: 2
    resources:
        mem_mb=4000,
        runtime=180,
    log:
        logs("train_generator"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/train_generator.py"


use rule train_generator as train_generator_reference with:
    input:
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        centroids=rules.cluster_identities.output.centroids,
        labels=rules.cluster_identities.output.labels,
        models=face_models_dir(),
        selection=reference_selection,
    output:
        model=results("generator", "reference", "model.safetensors"),
        config=results("generator", "reference", "config.json"),
        history=results("generator", "reference", "history.parquet"),
    params:
        mini=config["generator"]["mini"],
        faces=config["faces"],
        exclude=reference_excluded_identities,
        state=results("generator", "reference_train_state.pt"),
    log:
        logs("train_generator_reference"),
