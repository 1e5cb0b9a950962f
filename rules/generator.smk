# Stage "train generator": (re)build the mini Arc2Face on the embedded faces. Not part of the default target:
# the default run starts from the shipped checkpoint (generator.mini.checkpoint). Run `snakemake train_generator`.


rule train_generator:
    input:
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        centroids=rules.cluster_identities.output.centroids,
        models=face_models_dir(),
    output:
        model=results("generator", "trained", "model.safetensors"),
        config=results("generator", "trained", "config.json"),
        history=results("generator", "trained", "history.parquet"),
    params:
        mini=config["generator"]["mini"],
        faces=config["faces"],
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
