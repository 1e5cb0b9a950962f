# Stage "forget request" (config `request`, config/request.yaml): a folder of photos of one person -> the requester's
# photos (the identity stage's DBSCAN rule), in or out of the training data, anchor (eq. 6), unlearning with the run
# `request.run`, the original and the unlearned model evaluated and lightly audited on the request, the exported
# model, and the one-page report results/request/<name>/report.md (also on the HTML report's landing page).
# Active when request.folder (one person) or request.people (several: one joint run, one exported model, a report
# each) is set; its outputs are then the default target. Wildcard `person` is the prefix of a person's files under
# results/request/<name>/: '' for a one-person request (its files sit there directly), '<person>/' for each person.

wildcard_constraints:
    person=r"(|[A-Za-z0-9_.-]+/)",


# the demo folder of config/request.yaml, built from ORL when request.folder names it
rule demo_request_folder:
    output:
        directory(os.path.join(DATA, "request_demo")),
    params:
        demo=REQUEST["demo"],
        orl=config["dataset"]["orl"],
        cache_dir=ASSETS,
    log:
        logs("request/demo_request_folder"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/request_demo.py"


rule request_photos:
    input:
        folder=lambda wc: request_people()[wc.person],
        models=face_models_dir(),
    output:
        photos=request_dir("{person}photos.parquet"),
    params:
        faces=config["faces"],
        person=lambda wc: wc.person,
    threads: 2
    log:
        logs("request/{person}photos"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/request_photos.py"


# every person's photos together: the people share one retain split, and two folders of one person stop the request
rule request_selection:
    input:
        photos=lambda wc: request_person_files("photos.parquet"),
        centroids=rules.cluster_identities.output.centroids,
    output:
        photos=request_dir("{person}requester.parquet"),
        status=request_dir("{person}photos.csv"),
        selection=request_dir("{person}selection.json"),
    params:
        people=lambda wc: list(request_people()),
        person=lambda wc: wc.person,
        request=REQUEST,
        selection=config["selection"],
        identities=config["identities"],
        anchor_tau=lambda wc: request_run()["anchor_tau"],
        seed=config["seed"],
    log:
        logs("request/{person}selection"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/request_selection.py"


rule request_unlearn:
    input:
        selection=lambda wc: request_person_files("selection.json"),
        photos=lambda wc: request_person_files("requester.parquet"),
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
    output:
        changed=request_dir("unlearning", "changed_parameters.safetensors"),
        losses=request_dir("unlearning", "losses.parquet"),
        timings=request_dir("unlearning", "timings.json"),
    params:
        run=lambda wc: request_run(),
        run_name=REQUEST["run"],
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
        state=request_dir("unlearning", "resume_state.pt"),
    threads: 2
    resources:
        gpu=1,
        mem_mb=8000,
        runtime=60,
    log:
        logs("request/unlearn"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/request_unlearn.py"


# one person on the model (the world holds every person of the request: a joint model forgot them all)
rule request_assess_original:
    input:
        own=rules.request_selection.output.selection,
        selection=lambda wc: request_person_files("selection.json"),
        photos=lambda wc: request_person_files("requester.parquet"),
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
        verification=rules.calibrate_verification.output[0],
    output:
        samples=request_dir("{person}before", "samples.parquet"),
        metrics=request_dir("{person}before", "metrics.json"),
        rows=request_dir("{person}before", "audit_rows.parquet"),
    params:
        evaluation=evaluation_settings(),
        probes=lambda wc: request_probes(),
        generator=config["generator"],
        faces=config["faces"],
        device=config["unlearning"]["device"],
        seed=config["seed"],
    threads: 2
    resources:
        gpu=1,
        mem_mb=8000,
    log:
        logs("request/{person}assess_original"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/request_assess.py"


use rule request_assess_original as request_assess_unlearned with:
    input:
        changed=rules.request_unlearn.output.changed,
        before=rules.request_assess_original.output.samples,
        own=rules.request_selection.output.selection,
        selection=lambda wc: request_person_files("selection.json"),
        photos=lambda wc: request_person_files("requester.parquet"),
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        quality=quality_model(),
        verification=rules.calibrate_verification.output[0],
    output:
        samples=request_dir("{person}after", "samples.parquet"),
        metrics=request_dir("{person}after", "metrics.json"),
        rows=request_dir("{person}after", "audit_rows.parquet"),
    log:
        logs("request/{person}assess_unlearned"),


rule request_export:
    input:
        changed=rules.request_unlearn.output.changed,
        selection=lambda wc: request_person_files("selection.json"),
        generator=generator_files(),
    output:
        unet=unet_folder_files(request_dir("export", "unet")),
        delta=request_dir("export", "delta.safetensors"),
        manifest=request_dir("export", "manifest.json"),
    params:
        name=REQUEST["name"],
        people=lambda wc: [person.rstrip("/") for person in request_people()],
        run_name=REQUEST["run"],
        generator=config["generator"],
    threads: 1
    resources:
        mem_mb=8000,
    log:
        logs("request/export"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/request_export.py"


rule request_report:
    input:
        status=rules.request_selection.output.status,
        selection=rules.request_selection.output.selection,
        before_metrics=rules.request_assess_original.output.metrics,
        after_metrics=rules.request_assess_unlearned.output.metrics,
        before_rows=rules.request_assess_original.output.rows,
        after_rows=rules.request_assess_unlearned.output.rows,
        verification=rules.calibrate_verification.output[0],
        manifest=rules.request_export.output.manifest,
    output:
        markdown=report(request_dir("{person}report.md"), category="Forget request"),
        rst=request_dir("{person}report.rst"),
    params:
        name=lambda wc: REQUEST["name"] + (f" ({wc.person.rstrip('/')})" if wc.person else ""),
        folder=lambda wc: request_people()[wc.person],
        run_name=REQUEST["run"],
        run=lambda wc: request_run(),
    log:
        logs("request/{person}report"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/request_report.py"


rule request:
    """Target: the forget request's report, exported model and delta."""
    input:
        request_outputs(),
