# Stage "extract embeddings": detect, align and embed every image with the configured face analyser.


rule face_models:
    output:
        directory(face_models_dir()),
    params:
        faces=config["faces"],
        cache_dir=ASSETS,
    log:
        logs("face_models"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/face_models.py"


rule extract_embeddings:
    input:
        manifest=rules.acquire_dataset.output.manifest,
        models=face_models_dir(),
    output:
        embeddings=results("faces", "embeddings.parquet"),
    params:
        faces=config["faces"],
    threads: 2
    resources:
        mem_mb=4000,
    log:
        logs("extract_embeddings"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/extract_embeddings.py"
