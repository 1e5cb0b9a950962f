# Stage "aggregate": one table row per (run, forget identity), summaries with 95% intervals (the pooled SRK from the
# per-sample tables), the headline summary shown on the report's landing page, image grids.


rule aggregate:
    input:
        selections=rules.select_experiments.output.table,
        before=lambda wc: expand(rules.evaluate_original.output.metrics, identity=forget_identities()),
        before_samples=lambda wc: expand(rules.evaluate_original.output.samples, identity=forget_identities()),
        after=lambda wc: run_outputs("metrics"),
        # paired with the metrics by folder in the script
        after_samples=lambda wc: run_outputs("samples"),
        timings=lambda wc: run_outputs("timings"),
        external=lambda wc: external_outputs("metrics"),
        external_samples=lambda wc: external_outputs("samples"),
        # the audit's headline joins summary.md when the audit is in the default target
        audit=lambda wc: [results("tables", "audit_summary.md")] if config["audit"]["default_target"] else [],
    output:
        metrics=results("tables", "metrics.parquet"),
        metrics_csv=report(results("tables", "metrics.csv"), category="Tables"),
        counts=results("tables", "sample_counts.parquet"),
        summary=results("tables", "summary.parquet"),
        summary_csv=report(results("tables", "summary.csv"), category="Tables"),
        summary_long=report(results("tables", "summary_long.csv"), category="Summary"),
        summary_md=report(results("tables", "summary.md"), category="Summary"),
        costs=report(results("tables", "costs.csv"), category="Tables"),
    params:
        runs=run_names(),  # the names alone: each job's settings come from its timings
        external={name: entry.get("unet") or entry["generator"] for name, entry in external_models().items()},
        seed=config["seed"],
    log:
        logs("aggregate"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/aggregate.py"


rule landing_page:
    input:
        summary_long=rules.aggregate.output.summary_long,
        grids=lambda wc: [results("figures", run, f"{identity}_forget.png") for run, identity in landing_grids()],
        audit_summary=lambda wc: audit_tables_if_default("summary"),
        verdicts=lambda wc: audit_tables_if_default("verdicts"),
    output:
        results("tables", "landing.rst"),
    params:
        runs=lambda wc: [run for run, _ in landing_grids()],
        identities=lambda wc: [identity for run, identity in run_identity_pairs() if run == run_names()[0]],
    log:
        logs("landing_page"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/landing_page.py"


rule sample_grids:
    input:
        before=rules.evaluate_original.output.images,
        before_samples=rules.evaluate_original.output.samples,
        after=rules.evaluate_unlearned.output.images,
        after_samples=rules.evaluate_unlearned.output.samples,
    output:
        forget=report(results("figures", "{run}", "{identity}_forget.png"), category="Sample grids",
                      subcategory="{run}", labels={"identity": "{identity}", "samples": "forget"}),
        retain=report(results("figures", "{run}", "{identity}_retain.png"), category="Sample grids",
                      subcategory="{run}", labels={"identity": "{identity}", "samples": "retain"}),
    params:
        per_row=8,
    log:
        logs("sample_grids/{run}/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/sample_grids.py"


rule pareto:
    input:
        metrics=rules.aggregate.output.metrics,
        counts=rules.aggregate.output.counts,  # the pooled SRK per point
        losses=lambda wc: controllable_losses(),
    output:
        table=report(results("tables", "pareto.csv"), category="Controllable unlearning"),
        parquet=results("tables", "pareto.parquet"),
        summary=report(results("tables", "pareto_summary.csv"), category="Controllable unlearning"),
        figure=report(results("figures", "pareto.png"), category="Controllable unlearning"),
    params:
        points=controllable_points(),
        tolerances={base: spec["tolerance"] for base, spec in config["unlearning"]["controllable"].items()},
        seed=config["seed"],
    log:
        logs("pareto"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/pareto.py"
