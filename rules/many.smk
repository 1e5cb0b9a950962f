# Stage "many" (target `many`, not in the default target; README "Forgetting many people"): joint unlearning of the
# first N identities in one run (config many.joint_sizes) and a sequential chain, step i unlearning identity i from
# step i-1's weights (many.sequential_length), with one run's settings (many.run). Each job is evaluated on every
# identity it has forgotten (the evaluation's conditions and noise), the original model once per identity, and
# results/tables/many_{joint,sequential}.csv hold both. Retain sets: idunlearn.many. Step i's jobs read identities
# 1..i only (params), so changing identity 5 of an explicit list reruns steps 5-8 and the joint jobs holding it.

include: "many_common.smk"


# every eligible forget identity in the selection stage's order, and its ordinary selection (the original model's
# evaluation reads it); it depends on the selection settings only, never on the many section
checkpoint many_select:
    input:
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
    output:
        order=results("many", "selection", "order.parquet"),
        identities=directory(results("many", "selection", "identities")),
    params:
        selection=config["selection"],
        seed=config["seed"],
    log:
        logs("many/select"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/many_select.py"


rule many_unlearn_joint:
    input:
        order=many_order,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
    output:
        changed=results("many", "{run}", "joint", "n{n}", "changed_parameters.safetensors"),
        losses=results("many", "{run}", "joint", "n{n}", "losses.parquet"),
        timings=results("many", "{run}", "joint", "n{n}", "timings.json"),
        selections=results("many", "{run}", "joint", "n{n}", "selections.json"),
    params:
        mode="joint",
        identities=lambda wc: many_identities()[:int(wc.n)],
        run=lambda wc: run_config(config, wc.run),
        selection=config["selection"],
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
        state=lambda wc: results("many", wc.run, "joint", f"n{wc.n}", "resume_state.pt"),
    threads: 2
    resources:
        gpu=1,
        mem_mb=8000,
        runtime=60,
    log:
        logs("many/{run}/joint/n{n}"),
    benchmark:
        results("benchmarks", "many", "{run}", "joint", "n{n}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/many_unlearn.py"


use rule many_unlearn_joint as many_unlearn_step with:
    input:
        previous=many_step_previous,
        order=many_order,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
    output:
        changed=results("many", "{run}", "sequential", "step{step}", "changed_parameters.safetensors"),
        losses=results("many", "{run}", "sequential", "step{step}", "losses.parquet"),
        timings=results("many", "{run}", "sequential", "step{step}", "timings.json"),
        selections=results("many", "{run}", "sequential", "step{step}", "selections.json"),
    params:
        mode="sequential",
        identities=lambda wc: many_identities()[:int(wc.step)],
        run=lambda wc: run_config(config, wc.run),
        selection=config["selection"],
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
        state=lambda wc: results("many", wc.run, "sequential", f"step{wc.step}", "resume_state.pt"),
    log:
        logs("many/{run}/sequential/step{step}"),
    benchmark:
        results("benchmarks", "many", "{run}", "sequential", "step{step}.tsv")


# the original model on one identity: the ordinary evaluation job, on the checkpoint's selection of that identity
use rule evaluate_original as many_evaluate_before with:
    input:
        selection=lambda wc: os.path.join(checkpoints.many_select.get().output.identities, f"{wc.identity}.json"),
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("many", "before", "{identity}", "samples.parquet"),
        metrics=results("many", "before", "{identity}", "metrics.json"),
        images=results("many", "before", "{identity}", "images.npz"),
    log:
        logs("many/before/{identity}"),


rule many_evaluate_joint:
    input:
        changed=rules.many_unlearn_joint.output.changed,
        selections=rules.many_unlearn_joint.output.selections,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("many", "{run}", "joint", "n{n}", "evaluation", "samples.parquet"),
        metrics=results("many", "{run}", "joint", "n{n}", "evaluation", "metrics.parquet"),
    params:
        evaluation=evaluation_settings(),
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
    threads: 2
    resources:
        gpu=1,
        mem_mb=8000,
    log:
        logs("many/{run}/joint/n{n}_evaluate"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/many_evaluate.py"


use rule many_evaluate_joint as many_evaluate_step with:
    input:
        changed=rules.many_unlearn_step.output.changed,
        selections=rules.many_unlearn_step.output.selections,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("many", "{run}", "sequential", "step{step}", "evaluation", "samples.parquet"),
        metrics=results("many", "{run}", "sequential", "step{step}", "evaluation", "metrics.parquet"),
    log:
        logs("many/{run}/sequential/step{step}_evaluate"),


rule many_tables:
    input:
        order=many_order,
        before=lambda wc: expand(rules.many_evaluate_before.output.samples, identity=many_identities()),
        joint=lambda wc: many_job_files(rules.many_evaluate_joint.output.samples, "joint"),
        joint_timings=lambda wc: many_job_files(rules.many_unlearn_joint.output.timings, "joint"),
        sequential=lambda wc: many_job_files(rules.many_evaluate_step.output.samples, "sequential"),
        sequential_timings=lambda wc: many_job_files(rules.many_unlearn_step.output.timings, "sequential"),
        verification=rules.calibrate_verification.output[0],
    output:
        joint=results("tables", "many_joint.parquet"),
        joint_csv=report(results("tables", "many_joint.csv"), category="Forgetting many people"),
        sequential=results("tables", "many_sequential.parquet"),
        sequential_csv=report(results("tables", "many_sequential.csv"), category="Forgetting many people"),
        joint_plot=report(results("figures", "many_joint.png"), category="Forgetting many people"),
        sequential_plot=report(results("figures", "many_sequential.png"), category="Forgetting many people"),
    params:
        run=lambda wc: many_settings()["run"],
        identities=lambda wc: many_identities(),
        joint_sizes=lambda wc: sorted(many_settings()["joint_sizes"]),
    log:
        logs("many/tables"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/many_tables.py"


rule many:
    """Target: joint and sequential unlearning of many identities (config many)."""
    input:
        rules.many_tables.output,
