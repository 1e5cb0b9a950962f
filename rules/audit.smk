# Stage "audit": is the person really gone? A verification threshold calibrated on real impostor pairs, then probes
# (Leak@k conditions, every real photo, great circles around the forget centroid, relearning) on the original model
# (the control) and on every (run, forget identity), with the locality of the damage from the evaluation's samples.
# The held-out attacks (attack_heldout, inversion, relearning_heldout) run where audit.probes names them; the
# never-trained reference (an external model such as study.yaml's `retrain`) is audited like any run.
# Target `audit`; in the default target when `audit.default_target` is true.


rule calibrate_verification:
    input:
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
    output:
        results("audit", "verification.json"),
    params:
        verification=config["audit"]["verification"],
    log:
        logs("calibrate_verification"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/calibrate_verification.py"


rule second_recognizer_models:
    output:
        directory(second_recognizer_models_dir()),
    params:
        second=config["audit"]["second_recognizer"],
        cache_dir=ASSETS,
    log:
        logs("second_recognizer_models"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/second_recognizer_models.py"


rule second_recognizer_reference:
    input:
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        generator=generator_files(),
        models=second_recognizer_models_dir(),
    output:
        centroids=results("audit", "second_recognizer", "centroids.parquet"),
        verification=results("audit", "second_recognizer", "verification.json"),
    params:
        second=config["audit"]["second_recognizer"],
        verification=config["audit"]["verification"],
        generator=config["generator"],
    log:
        logs("second_recognizer_reference"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/second_recognizer_reference.py"


rule audit_original:
    input:
        unpack(second_recognizer_inputs),
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        verification=rules.calibrate_verification.output[0],
        evaluation=rules.evaluate_original.output.samples,
        evaluation_images=rules.evaluate_original.output.images,
    output:
        samples=results("audit", "before", "{identity}", "samples.parquet"),
        rows=results("audit", "before", "{identity}", "rows.parquet"),
    params:
        probes=audit_probes,
        second=config["audit"]["second_recognizer"],
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
        logs("audit/before/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/audit.py"


use rule audit_original as audit_unlearned with:
    input:
        unpack(second_recognizer_inputs),
        changed=rules.unlearn.output.changed,
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        verification=rules.calibrate_verification.output[0],
        evaluation=rules.evaluate_unlearned.output.samples,
        evaluation_images=rules.evaluate_unlearned.output.images,
        before=rules.evaluate_original.output.samples,
    output:
        samples=results("audit", "after", "{run}", "{identity}", "samples.parquet"),
        rows=results("audit", "after", "{run}", "{identity}", "rows.parquet"),
    log:
        logs("audit/after/{run}/{identity}"),


use rule audit_original as audit_external with:
    input:
        unpack(second_recognizer_inputs),
        unpack(external_model),
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        verification=rules.calibrate_verification.output[0],
        evaluation=rules.evaluate_external.output.samples,
        evaluation_images=rules.evaluate_external.output.images,
        before=rules.evaluate_original.output.samples,
    output:
        samples=results("audit", "external", "{external}", "{identity}", "samples.parquet"),
        rows=results("audit", "external", "{external}", "{identity}", "rows.parquet"),
    log:
        logs("audit/external/{external}/{identity}"),


# The worst-case relearning protocol (audit.probes.relearning_worstcase): a job of its own per audited (run, identity)
# and external model, beside the audit jobs (their params leave the probe out), so that turning it on reruns none of
# them; its rows join the audit table.
rule audit_worstcase:
    input:
        changed=rules.unlearn.output.changed,
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        verification=rules.calibrate_verification.output[0],
    output:
        rows=results("audit", "worstcase", "{run}", "{identity}", "rows.parquet"),
    params:
        probe=worstcase_settings,
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
        logs("audit/worstcase/{run}/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/audit_worstcase.py"


use rule audit_worstcase as audit_worstcase_external with:
    input:
        unpack(external_model),
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        verification=rules.calibrate_verification.output[0],
    output:
        rows=results("audit", "worstcase", "external", "{external}", "{identity}", "rows.parquet"),
    log:
        logs("audit/worstcase/external/{external}/{identity}"),


# More attack samples for the verdicts (audit.attack_samples): a job of its own per audited (run, identity) and
# external model repeats only the attack's search, with the audit job's seeds, and draws that many samples from the
# winning condition; its rows replace the audit job's attack rows in the tables, so that raising the number reruns
# none of the audit jobs.
rule audit_attack_samples:
    input:
        unpack(second_recognizer_inputs),
        changed=rules.unlearn.output.changed,
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        verification=rules.calibrate_verification.output[0],
    output:
        rows=results("audit", "attack_samples", "{run}", "{identity}", "rows.parquet"),
    params:
        attack={**config["audit"]["probes"].get("attack", {}), "samples": config["audit"]["attack_samples"]},
        second=config["audit"]["second_recognizer"],
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
        logs("audit/attack_samples/{run}/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/audit_attack_samples.py"


use rule audit_attack_samples as audit_attack_samples_external with:
    input:
        unpack(second_recognizer_inputs),
        unpack(external_model),
        selection=selection_file,
        manifest=rules.acquire_dataset.output.manifest,
        faces=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
        generator=generator_files(),
        models=face_models_dir(),
        verification=rules.calibrate_verification.output[0],
    output:
        rows=results("audit", "attack_samples", "external", "{external}", "{identity}", "rows.parquet"),
    log:
        logs("audit/attack_samples/external/{external}/{identity}"),


# What the audit jobs share (the selection, the verification thresholds, the original model's evaluation of each
# audited identity): built on its own before a job archive is restored, so that the resumed run does not rebuild it
# and so redo the archived jobs (docs/audit.md, python -m idunlearn archive).
rule audit_inputs:
    input:
        unpack(second_recognizer_inputs),
        verification=rules.calibrate_verification.output[0],
        before=lambda wc: expand(rules.evaluate_original.output.samples, identity=audited_identities()),
        images=lambda wc: expand(rules.evaluate_original.output.images, identity=audited_identities()),


rule audit_tables:
    input:
        verification=rules.calibrate_verification.output[0],
        before=lambda wc: expand(rules.audit_original.output.rows, identity=audited_identities()),
        # the run (or external model) name is the rows' folder name
        after=lambda wc: [expand(rules.audit_unlearned.output.rows, run=run, identity=identity)[0]
                          for run, identity in audited_pairs()]
        + [expand(rules.audit_external.output.rows, external=name, identity=identity)[0]
           for name, identity in audited_external_pairs()],
        worstcase=lambda wc: worstcase_rows(),
        # more attack samples (audit.attack_samples; none while it is 0): these rows replace the audit jobs' attack rows
        attack_samples=lambda wc: attack_samples_rows(),
    output:
        table=results("tables", "audit.parquet"),
        csv=report(results("tables", "audit.csv"), category="Forgetting audit"),
        summary=report(results("tables", "audit_summary.csv"), category="Forgetting audit"),
        summary_md=report(results("tables", "audit_summary.md"), category="Forgetting audit"),
        neighbourhood=report(results("figures", "audit", "neighbourhood.png"), category="Forgetting audit"),
        locality=report(results("figures", "audit", "locality.png"), category="Forgetting audit"),
        verdicts=report(results("tables", "audit_verdicts.csv"), category="Forgetting audit"),
        comparisons=results("tables", "audit_comparisons.csv"),
        # the further pairs of audited runs (audit.pairs), on the same measures
        pairs=results("tables", "audit_pairs.csv"),
        # every run against the never-trained reference (audit.verdict.reference; empty when it is not audited)
        against_reference=report(results("tables", "audit_vs_reference.csv"), category="Forgetting audit"),
        relearning_curves=report(results("figures", "audit", "relearning_curves.png"), category="Forgetting audit"),
        # every run against the removal targets under the held-out attacks (audit.targets)
        targets=report(results("tables", "audit_targets.csv"), category="Forgetting audit"),
        # which audit attacks each run's method trains against (its declared training ranges; audit/heldout.py)
        trained_against=report(results("tables", "audit_trained_against.csv"), category="Forgetting audit"),
        # the worst-case relearning protocol (audit.probes.relearning_worstcase; empty when it is off): every cell
        # beside the never-trained reference's, and per run and step count the worst case over lr and regime
        worstcase=report(results("tables", "audit_worstcase.csv"), category="Forgetting audit"),
        worstcase_summary=report(results("tables", "audit_worstcase_summary.csv"), category="Forgetting audit"),
    params:
        seed=config["seed"],
        probes=config["audit"]["probes"],
        training=lambda wc: audited_training(),
        verdict=config["audit"]["verdict"],
        reference=audit_reference(),
        pairs=audit_pairs(),
        targets=config["audit"]["targets"],
    log:
        logs("audit_tables"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/audit_tables.py"


# The audited runs' evaluation beside each other: the aggregate stage's tables on the audit's runs and identities
# only (the study's tables need every run of the config), and each run paired with compare_to and with the
# never-trained reference on forget / retain ISM, pooled SRK, KD and quality changes and unlearning time.
use rule aggregate as audit_evaluation with:
    input:
        selections=rules.select_experiments.output.table,
        before=lambda wc: expand(rules.evaluate_original.output.metrics, identity=audited_identities()),
        before_samples=lambda wc: expand(rules.evaluate_original.output.samples, identity=audited_identities()),
        after=lambda wc: run_outputs("metrics", audited_pairs()),
        after_samples=lambda wc: run_outputs("samples", audited_pairs()),
        timings=lambda wc: run_outputs("timings", audited_pairs()),
        external=lambda wc: external_outputs("metrics", audited_external_pairs()),
        external_samples=lambda wc: external_outputs("samples", audited_external_pairs()),
        audit=[],
    output:
        metrics=results("tables", "audit_evaluation", "metrics.parquet"),
        metrics_csv=results("tables", "audit_evaluation", "metrics.csv"),
        counts=results("tables", "audit_evaluation", "sample_counts.parquet"),
        summary=results("tables", "audit_evaluation", "summary.parquet"),
        summary_csv=results("tables", "audit_evaluation", "summary.csv"),
        summary_long=results("tables", "audit_evaluation", "summary_long.csv"),
        summary_md=report(results("tables", "audit_evaluation", "summary.md"), category="Forgetting audit"),
        costs=results("tables", "audit_evaluation", "costs.csv"),
    params:
        runs=lambda wc: audited_runs(),
        external={name: entry.get("unet") or entry["generator"] for name, entry in external_models().items()},
        seed=config["seed"],
    log:
        logs("audit_evaluation"),


rule audit_evaluation_comparisons:
    input:
        metrics=rules.audit_evaluation.output.metrics,
        counts=rules.audit_evaluation.output.counts,
        costs=rules.audit_evaluation.output.costs,
    output:
        report(results("tables", "audit_evaluation", "comparisons.csv"), category="Forgetting audit"),
    params:
        compare_to=audit_reference(),
        reference=config["audit"]["verdict"]["reference"],
        seed=config["seed"],
    log:
        logs("audit_evaluation_comparisons"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/audit_evaluation_comparisons.py"


rule audit:
    input:
        rules.audit_tables.output,
        rules.audit_evaluation_comparisons.output,
