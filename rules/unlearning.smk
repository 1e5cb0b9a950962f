# Stage "unlearn": one job per (method configuration, forget identity), starting from the original generator.


rule unlearn:
    input:
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        boundaries=epsilon_boundary_losses,
        tuning_choice=tuning_choice_input,
    output:
        changed=results("unlearning", "{run}", "{identity}", "changed_parameters.safetensors"),
        losses=results("unlearning", "{run}", "{identity}", "losses.parquet"),
        timings=results("unlearning", "{run}", "{identity}", "timings.json"),
    params:
        # only the settings the run's method and optimiser read (schema x-reads): others never rerun it
        run=lambda wc: job_run_settings(config, wc.run),
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
        state=lambda wc: results("unlearning", wc.run, wc.identity, "resume_state.pt"),
    threads: JOB_THREADS
    resources:
        gpu=1,
        mem_mb=8000,
        runtime=60,
    log:
        logs("unlearn/{run}/{identity}"),
    benchmark:
        results("benchmarks", "unlearn", "{run}", "{identity}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/unlearn.py"
