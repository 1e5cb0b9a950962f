# Stage "tune": the declared tuning protocol of the generator track (config `tuning`). Tuning identities disjoint from
# the study's, one job per (method setting, tuning identity) through the unlearning and evaluation rules, and the
# declared rule's choice per method in results/tables/tuning/; a run <run>.tuned then runs at the chosen setting.


checkpoint tune_select:
    input:
        study=rules.select_experiments.output.table,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
    output:
        table=results("tuning", "selection", "selections.parquet"),
        csv=results("tables", "tuning", "identities.csv"),
        identities=directory(results("tuning", "selection", "identities")),
    params:
        selection=config["selection"],
        tuning={k: config["tuning"][k] for k in ("n_identities", "retain_val_identities", "seed")},
        seed=config["seed"],
    log:
        logs("tune/select"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/tune_select.py"


use rule unlearn as tune_unlearn with:
    input:
        selection=tuning_selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
    output:
        changed=results("tuning", "unlearning", "{run}", "{identity}", "changed_parameters.safetensors"),
        losses=results("tuning", "unlearning", "{run}", "{identity}", "losses.parquet"),
        timings=results("tuning", "unlearning", "{run}", "{identity}", "timings.json"),
    params:
        run=lambda wc: tuning_settings(config)[wc.run]["run"],
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["tuning"]["seed"],
        state=lambda wc: results("tuning", "unlearning", wc.run, wc.identity, "resume_state.pt"),
    log:
        logs("tune/unlearn/{run}/{identity}"),
    benchmark:
        results("benchmarks", "tune", "{run}", "{identity}.tsv")


use rule evaluate_original as tune_evaluate_original with:
    input:
        selection=tuning_selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("tuning", "evaluation", "before", "{identity}", "samples.parquet"),
        metrics=results("tuning", "evaluation", "before", "{identity}", "metrics.json"),
        images=results("tuning", "evaluation", "before", "{identity}", "images.npz"),
    params:
        evaluation=evaluation_settings(),
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["tuning"]["seed"],
    log:
        logs("tune/evaluate/before/{identity}"),


use rule tune_evaluate_original as tune_evaluate_unlearned with:
    input:
        changed=rules.tune_unlearn.output.changed,
        timings=rules.tune_unlearn.output.timings,
        selection=tuning_selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
    output:
        samples=results("tuning", "evaluation", "after", "{run}", "{identity}", "samples.parquet"),
        metrics=results("tuning", "evaluation", "after", "{run}", "{identity}", "metrics.json"),
        images=results("tuning", "evaluation", "after", "{run}", "{identity}", "images.npz"),
    log:
        logs("tune/evaluate/after/{run}/{identity}"),


rule tune_choose:
    input:
        before=lambda wc: expand(rules.tune_evaluate_original.output.samples, identity=tuning_identities()),
        after=lambda wc: expand(rules.tune_evaluate_unlearned.output.samples, run=list(tuning_settings(config)),
                                identity=tuning_identities()),
    output:
        choice=results("tables", "tuning", "choice.json"),
        grid=report(results("tables", "tuning", "grid.csv"), category="Tuning"),
        report=report(results("tables", "tuning", "tuning.md"), category="Tuning"),
    params:
        settings=tuning_settings(config),
        rule=config["tuning"]["rule"],
        success=config["tuning"]["success"],
    log:
        logs("tune/choose"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/tune_choose.py"


rule tune:
    """Target: the tuning protocol's tables (grid, rule, choice)."""
    input:
        tune_tables,
