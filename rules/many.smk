# Stage "many" (target `many`, not in the default target; docs/results/many-people.md): over many.orders
# identity orders, joint unlearning of the first N identities in one run (many.joint_sizes, budget
# many.joint_budget), chains of many.sequential_length steps (one per many.sequential_protections), and merges of the
# per-identity single runs (many.merges), all with one run's settings (many.run). N = 1 and step 1 of every strategy
# are the single job of the order's first identity. Each job is evaluated on every identity it has forgotten (the
# evaluation's conditions and noise), the original model once per identity; results/tables/many_*.csv hold the rows,
# the per-strategy summary with intervals over the orders and the paired comparisons. Retain sets: idunlearn.many.
# Step i's jobs read identities 1..i only (params), so changing identity 5 reruns steps 5-8 and the jobs holding it.

include: "many_common.smk"


# every eligible forget identity in the selection stage's order, and its ordinary selection (the single jobs and the
# original model's evaluation read it); it depends on the selection settings only, never on the many section
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


# one identity alone: the ordinary unlearn job (same selection, seed and settings, so the same bytes) of any eligible
# identity, beyond the selection stage's n_forget
use rule unlearn as many_unlearn_single with:
    input:
        selection=many_selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
    output:
        changed=results("many", "{run}", "single", "{identity}", "changed_parameters.safetensors"),
        losses=results("many", "{run}", "single", "{identity}", "losses.parquet"),
        timings=results("many", "{run}", "single", "{identity}", "timings.json"),
    params:
        run=lambda wc: job_run_settings(config, wc.run),
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
        state=lambda wc: results("many", wc.run, "single", wc.identity, "resume_state.pt"),
    log:
        logs("many/{run}/single/{identity}"),
    benchmark:
        results("benchmarks", "many", "{run}", "single", "{identity}.tsv")


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
        changed=results("many", "{run}", "o{order}", "joint", "n{n}", "changed_parameters.safetensors"),
        losses=results("many", "{run}", "o{order}", "joint", "n{n}", "losses.parquet"),
        timings=results("many", "{run}", "o{order}", "joint", "n{n}", "timings.json"),
        selections=results("many", "{run}", "o{order}", "joint", "n{n}", "selections.json"),
    params:
        mode="joint",
        protection="none",
        identities=lambda wc: many_order_ids(wc)[:int(wc.n)],
        run=many_joint_run,
        weights=None,
        selection=config["selection"],
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
        state=lambda wc: results("many", wc.run, f"o{wc.order}", "joint", f"n{wc.n}", "resume_state.pt"),
    # the orders' chains and joint jobs are independent, so one-thread jobs side by side beat two-thread ones
    threads: JOB_THREADS
    resources:
        gpu=1,
        mem_mb=8000,
        runtime=60,
    log:
        logs("many/{run}/o{order}/joint/n{n}"),
    benchmark:
        results("benchmarks", "many", "{run}", "o{order}", "joint", "n{n}.tsv")
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
        changed=results("many", "{run}", "o{order}", "{protection}", "step{step}", "changed_parameters.safetensors"),
        losses=results("many", "{run}", "o{order}", "{protection}", "step{step}", "losses.parquet"),
        timings=results("many", "{run}", "o{order}", "{protection}", "step{step}", "timings.json"),
        selections=results("many", "{run}", "o{order}", "{protection}", "step{step}", "selections.json"),
    params:
        mode="sequential",
        protection=lambda wc: wc.protection,
        identities=lambda wc: many_order_ids(wc)[:int(wc.step)],
        run=lambda wc: many_step_run(wc)[0],
        weights=lambda wc: many_step_run(wc)[1],
        selection=config["selection"],
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
        state=lambda wc: results("many", wc.run, f"o{wc.order}", wc.protection, f"step{wc.step}", "resume_state.pt"),
    log:
        logs("many/{run}/o{order}/{protection}/step{step}"),
    benchmark:
        results("benchmarks", "many", "{run}", "o{order}", "{protection}", "step{step}.tsv")


# the single jobs of the order's first N identities merged into one model (no training: seconds)
rule many_merge:
    input:
        order=many_order,
        changed=lambda wc: many_merged(wc)["changed"],
        selections=lambda wc: many_merged(wc)["selections"],
        faces=rules.extract_embeddings.output.embeddings,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
    output:
        changed=results("many", "{run}", "o{order}", "merge_{merge}", "n{n}", "changed_parameters.safetensors"),
        timings=results("many", "{run}", "o{order}", "merge_{merge}", "n{n}", "timings.json"),
        selections=results("many", "{run}", "o{order}", "merge_{merge}", "n{n}", "selections.json"),
    params:
        merge=lambda wc: wc.merge,
        identities=lambda wc: many_order_ids(wc)[:int(wc.n)],
        settings=lambda wc: {k: many_settings()[k] for k in ("merge_mixtures", "merge_preserve_weight",
                                                              "merge_lambda")} if wc.merge in CLOSED_FORM_MERGES else {},
        generator=config["generator"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
    threads: 1
    resources:
        mem_mb=8000,
    log:
        logs("many/{run}/o{order}/merge_{merge}/n{n}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/many_merge.py"


# the original model on one identity: the ordinary evaluation job, on the checkpoint's selection of that identity
use rule evaluate_original as many_evaluate_before with:
    input:
        selection=many_selection_file,
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
        samples=results("many", "{run}", "o{order}", "joint", "n{n}", "evaluation", "samples.parquet"),
        metrics=results("many", "{run}", "o{order}", "joint", "n{n}", "evaluation", "metrics.parquet"),
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
        logs("many/{run}/o{order}/joint/n{n}_evaluate"),
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
        samples=results("many", "{run}", "o{order}", "{protection}", "step{step}", "evaluation", "samples.parquet"),
        metrics=results("many", "{run}", "o{order}", "{protection}", "step{step}", "evaluation", "metrics.parquet"),
    log:
        logs("many/{run}/o{order}/{protection}/step{step}_evaluate"),


use rule many_evaluate_joint as many_evaluate_merge with:
    input:
        changed=rules.many_merge.output.changed,
        selections=rules.many_merge.output.selections,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("many", "{run}", "o{order}", "merge_{merge}", "n{n}", "evaluation", "samples.parquet"),
        metrics=results("many", "{run}", "o{order}", "merge_{merge}", "n{n}", "evaluation", "metrics.parquet"),
    log:
        logs("many/{run}/o{order}/merge_{merge}/n{n}_evaluate"),


use rule many_evaluate_joint as many_evaluate_single with:
    input:
        changed=rules.many_unlearn_single.output.changed,
        selections=many_selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("many", "{run}", "single", "{identity}", "evaluation", "samples.parquet"),
        metrics=results("many", "{run}", "single", "{identity}", "evaluation", "metrics.parquet"),
    log:
        logs("many/{run}/single/{identity}_evaluate"),


rule many_tables:
    input:
        order=many_order,
        before=lambda wc: expand(rules.many_evaluate_before.output.samples,
                                 identity=sorted({i for ids in many_orders() for i in ids})),
        samples=lambda wc: [job["samples"] for job in many_table_jobs()],
        timings=lambda wc: sorted({t for job in many_table_jobs() for t in job["timings"]}),
        verification=rules.calibrate_verification.output[0],
    output:
        joint=results("tables", "many_joint.parquet"),
        joint_csv=report(results("tables", "many_joint.csv"), category="Forgetting many people"),
        sequential=results("tables", "many_sequential.parquet"),
        sequential_csv=report(results("tables", "many_sequential.csv"), category="Forgetting many people"),
        merge_csv=report(results("tables", "many_merge.csv"), category="Forgetting many people"),
        strategies_csv=report(results("tables", "many_strategies.csv"), category="Forgetting many people"),
        comparisons_csv=report(results("tables", "many_comparisons.csv"), category="Forgetting many people"),
        joint_plot=report(results("figures", "many_joint.png"), category="Forgetting many people"),
        sequential_plot=report(results("figures", "many_sequential.png"), category="Forgetting many people"),
    params:
        run=lambda wc: many_settings()["run"],
        jobs=lambda wc: many_table_jobs(),
        before=lambda wc: sorted({i for ids in many_orders() for i in ids}),  # identities of input.before, in order
        seed=config["seed"],
    log:
        logs("many/tables"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/many_tables.py"


rule many:
    """Target: joint, sequential and merged unlearning of many identities over several orders (config many)."""
    input:
        rules.many_tables.output,
