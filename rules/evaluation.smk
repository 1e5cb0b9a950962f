# Stage "evaluate": the same conditions and initial noise before (once per identity) and after each run.


rule evaluate_original:
    input:
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("evaluation", "before", "{identity}", "samples.parquet"),
        metrics=results("evaluation", "before", "{identity}", "metrics.json"),
        images=results("evaluation", "before", "{identity}", "images.npz"),
    params:
        evaluation=evaluation_settings(),
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
    threads: JOB_THREADS
    resources:
        gpu=1,
        mem_mb=8000,
    log:
        logs("evaluate/before/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/evaluate.py"


use rule evaluate_original as evaluate_unlearned with:
    input:
        changed=rules.unlearn.output.changed,
        timings=rules.unlearn.output.timings,
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("evaluation", "after", "{run}", "{identity}", "samples.parquet"),
        metrics=results("evaluation", "after", "{run}", "{identity}", "metrics.json"),
        images=results("evaluation", "after", "{run}", "{identity}", "images.npz"),
    log:
        logs("evaluate/after/{run}/{identity}"),


# a model made elsewhere (config evaluation.external): its UNet in the configured generator, or a whole mini generator
# (the never-trained reference), at the selection's anchor
use rule evaluate_original as evaluate_external with:
    input:
        unpack(external_model),
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("evaluation", "external", "{external}", "{identity}", "samples.parquet"),
        metrics=results("evaluation", "external", "{external}", "{identity}", "metrics.json"),
        images=results("evaluation", "external", "{external}", "{identity}", "images.npz"),
    log:
        logs("evaluate/external/{external}/{identity}"),
