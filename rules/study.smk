# Stage "study": the PIU paper's Tables 1-6 from the metrics and per-sample count tables (pooled SRK), beside the
# paper's values, and the generated, paired-tested summary of which of the paper's claims hold here. Configured by
# the `study` section (config/study.yaml).


rule study:
    input:
        metrics=rules.aggregate.output.metrics,
        counts=rules.aggregate.output.counts,
    output:
        tables=[report(results("tables", "study", f"{name}.csv"), category="Paper tables") for name in config["study"]],
        parquet=[results("tables", "study", f"{name}.parquet") for name in config["study"]],
        claims=report(results("tables", "study", "claims.md"), category="Paper tables"),
        claims_csv=results("tables", "study", "claims.csv"),
    params:
        config={"study": config["study"], "unlearning": config["unlearning"], "selection": config["selection"],
                "seed": config["seed"]},
    log:
        logs("study"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/study.py"
