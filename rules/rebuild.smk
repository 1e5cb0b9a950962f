# Stage "rebuild": remove the selection's forget identities together by distilling the original generator, the forget
# people mapped to their anchors, into a noised copy (src/idunlearn/rebuild.py, docs/rebuild.md). Not in the default
# target: `snakemake rebuild --configfile config/study.yaml config/rebuild.yaml`. One search job per search setting
# (the embedding search on the original model whose finds are mapped, shared by the runs that agree on it), then one
# job per (run, budget); a larger budget resumes the smaller's training, so a run's budgets cost as much as its largest.


rule rebuild_search:
    input:
        selections=rules.select_experiments.output.table,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
    output:
        found=results("rebuild", "search-{search}", "found.parquet"),
        ledger=results("rebuild", "search-{search}", "search.json"),
    params:
        # every run whose search settings (and seed) agree shares one search
        settings=lambda wc: rebuild_search_settings(wc.search),
        selection=config["selection"],
        seed=config["seed"],
        generator=config["generator"],
        faces=config["faces"],
    threads: JOB_THREADS
    resources:
        mem_mb=4000,
        runtime=60,
    log:
        logs("rebuild/search-{search}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/rebuild_search.py"


rule rebuild_budget:
    input:
        unpack(rebuild_previous_budget),
        selections=rules.select_experiments.output.table,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        reference=lambda wc: os.path.join(reference_generator_folder(), "config.json"),
        found=lambda wc: results("rebuild", f"search-{rebuild_search_key(wc.name)}", "found.parquet"),
        search=lambda wc: results("rebuild", f"search-{rebuild_search_key(wc.name)}", "search.json"),
    output:
        model=results("rebuild", "{name}", "b{budget}", "model.safetensors"),
        config=results("rebuild", "{name}", "b{budget}", "config.json"),
        ledger=results("rebuild", "{name}", "b{budget}", "ledger.json"),
        queries=results("rebuild", "{name}", "b{budget}", "queries.parquet"),
        losses=results("rebuild", "{name}", "b{budget}", "losses.parquet"),
    params:
        settings=lambda wc: rebuild_run(wc.name),
        selection=config["selection"],
        seed=config["seed"],
        generator=config["generator"],
        # one resume state per run's settings (budgets aside): each budget's job continues the smaller one's
        state=lambda wc: results("rebuild", wc.name, f"state-{rebuild_settings_key(wc.name)}.pt"),
    wildcard_constraints:
        budget=r"\d+",
    threads: JOB_THREADS
    resources:
        mem_mb=6000,
        runtime=600,
    log:
        logs("rebuild/{name}/b{budget}"),
    benchmark:
        results("benchmarks", "rebuild", "{name}", "b{budget}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/rebuild.py"


rule rebuild:
    input:
        [results("rebuild", name, f"b{budget}", "model.safetensors") for name, budget in rebuild_jobs()],


rule rebuild_tables:
    input:
        ledgers=lambda wc: [results("rebuild", run, f"b{budget}", "ledger.json")
                            for run, budget in rebuild_models().values()],
        rebuilt=lambda wc: external_outputs("metrics", [(m, i) for m, i in external_identity_pairs()
                                                         if m in rebuild_models()]),
        reference=lambda wc: external_outputs("metrics", [(m, i) for m, i in external_identity_pairs()
                                                           if m == config["audit"]["verdict"]["reference"]]),
        compared=lambda wc: expand(rules.evaluate_unlearned.output.metrics, run=config["audit"]["compare_to"],
                                   identity=forget_identities()),
        # the worst-case relearning protocol's rows of the rebuilt models and `retrain` (none while it is off)
        worstcase=lambda wc: rebuild_worstcase_rows(),
    output:
        curve=report(results("tables", "rebuild_curve.csv"), category="Rebuild"),
        targets=report(results("tables", "rebuild_targets.csv"), category="Rebuild"),
        figure=report(results("figures", "rebuild", "curve.png"), category="Rebuild"),
    params:
        models=lambda wc: rebuild_models(),
        reference=config["audit"]["verdict"]["reference"],
        compare_to=config["audit"]["compare_to"],
        training=lambda wc: audited_training(),
        probes=config["audit"]["probes"],
        seed=config["seed"],
    log:
        logs("rebuild_tables"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/rebuild_tables.py"


rule rebuild_grid:
    input:
        original=rules.evaluate_original.output.images,
        original_samples=rules.evaluate_original.output.samples,
        rebuilt=lambda wc: expand(rules.evaluate_external.output.images, external=wc.external, identity=wc.identity),
        rebuilt_samples=lambda wc: expand(rules.evaluate_external.output.samples, external=wc.external,
                                          identity=wc.identity),
        reference=lambda wc: expand(rules.evaluate_external.output.images,
                                    external=config["audit"]["verdict"]["reference"], identity=wc.identity),
        reference_samples=lambda wc: expand(rules.evaluate_external.output.samples,
                                            external=config["audit"]["verdict"]["reference"], identity=wc.identity),
    output:
        forget=report(results("figures", "rebuild", "{external}", "{identity}_forget.png"), category="Rebuild"),
        retain=report(results("figures", "rebuild", "{external}", "{identity}_retain.png"), category="Rebuild"),
    params:
        reference=config["audit"]["verdict"]["reference"],
        per_row=8,
    log:
        logs("rebuild_grid/{external}/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/rebuild_grid.py"
