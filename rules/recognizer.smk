# Recognizer track: forget a person in a face-recognition classifier with GSUO, against the usual baselines.
# Class-wise forgetting of the generator track's forget identities (ORL) and random-subset forgetting (~10% of the
# training set) on ORL and Fashion-MNIST. Not part of the default target: `snakemake recognizer` (or `make recognizer`).

include: "recognizer_common.smk"


rule recognizer_orl_data:
    input:
        manifest=rules.acquire_dataset.output.manifest,
        embeddings=rules.extract_embeddings.output.embeddings,
        labels=rules.cluster_identities.output.labels,
    output:
        recognizer_results("data", "orl.npz"),
    params:
        dataset=config["dataset"],
        orl={k: config["recognizer"]["orl"][k] for k in ("image_size", "train_fraction")},
        seed=config["seed"],
    log:
        logs("recognizer/data_orl"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_data.py"


rule recognizer_fashion_mnist_data:
    output:
        recognizer_results("data", "fashion_mnist.npz"),
    params:
        fashion_mnist={k: v for k, v in config["recognizer"]["fashion_mnist"].items()
                       if k not in ("model", "training", "method_overrides")},
        data_dir=DATA,
        seed=config["seed"],
    log:
        logs("recognizer/data_fashion_mnist"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_data.py"


rule recognizer_original:
    input:
        data=recognizer_results("data", "{dataset}.npz"),
    output:
        model=recognizer_results("models", "{dataset}", "original.safetensors"),
        info=recognizer_results("models", "{dataset}", "original.json"),
    params:
        settings=lambda wc: {k: config["recognizer"][wc.dataset][k] for k in ("model", "training")},
        seed=config["seed"],
    wildcard_constraints:
        dataset="orl|fashion_mnist",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/original_{dataset}"),
    benchmark:
        results("benchmarks", "recognizer", "original_{dataset}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_original.py"


rule recognizer_shadows:
    input:
        data=recognizer_results("data", "{dataset}.npz"),
    output:
        recognizer_results("mia", "{dataset}", "shadows.npz"),
    params:
        settings=lambda wc: {k: config["recognizer"][wc.dataset][k] for k in ("model", "training")},
        mia=config["recognizer"]["mia"],
        seed=config["seed"],
    wildcard_constraints:
        dataset="orl|fashion_mnist",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/shadows_{dataset}"),
    benchmark:
        results("benchmarks", "recognizer", "shadows_{dataset}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_shadows.py"


# U-LiRA (recognizer.ulira): base shadow models per dataset, then per random-subset experiment every method unlearned
# inside each of them; jobs of their own so that the experiments above do not carry its cost.
rule recognizer_ulira_shadows:
    input:
        data=recognizer_results("data", "{dataset}.npz"),
    output:
        membership=recognizer_results("mia", "{dataset}", "ulira", "membership.npz"),
        models=expand(recognizer_results("mia", "{{dataset}}", "ulira", "shadow{k}.safetensors"),
                      k=range(config["recognizer"]["ulira"]["n_shadows"])),
    params:
        settings=lambda wc: {k: config["recognizer"][wc.dataset][k] for k in ("model", "training")},
        n_shadows=config["recognizer"]["ulira"]["n_shadows"],
        seed=config["seed"],
    wildcard_constraints:
        dataset="orl|fashion_mnist",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/ulira_shadows_{dataset}"),
    benchmark:
        results("benchmarks", "recognizer", "ulira_shadows_{dataset}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_ulira.py"


rule recognizer_ulira:
    input:
        data=recognizer_results("data", "{dataset}.npz"),
        model=rules.recognizer_original.output.model,
        membership=rules.recognizer_ulira_shadows.output.membership,
        shadows=rules.recognizer_ulira_shadows.output.models,
    output:
        recognizer_results("runs", "random_subset", "{dataset}", "{experiment}", "ulira.parquet"),
    params:
        recognizer=lambda wc: recognizer_ulira.job_config(config["recognizer"], wc.dataset),
        seed=config["seed"],
    wildcard_constraints:
        dataset="orl|fashion_mnist",
        experiment=r"seed\d+",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/random_subset/{dataset}/{experiment}_ulira"),
    benchmark:
        results("benchmarks", "recognizer", "random_subset", "{dataset}", "{experiment}_ulira.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_ulira.py"


rule recognizer_experiment:
    input:
        data=recognizer_results("data", "{dataset}.npz"),
        model=rules.recognizer_original.output.model,
        shadows=rules.recognizer_shadows.output[0],
        selection=recognizer_selection,
    output:
        recognizer_results("runs", "{task}", "{dataset}", "{experiment}", "metrics.parquet"),
    params:
        recognizer=lambda wc: experiment_config(config["recognizer"], wc.task, wc.dataset),
        seed=config["seed"],
    wildcard_constraints:
        task="random_subset|classwise",
        dataset="orl|fashion_mnist",
        experiment=r"(id\d+-)?seed\d+",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/{task}/{dataset}/{experiment}"),
    benchmark:
        results("benchmarks", "recognizer", "{task}", "{dataset}", "{experiment}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_experiment.py"


rule recognizer_tuned_experiment:
    """The tuning protocol's chosen settings on an evaluation experiment (speedup against its paper-setting Retrain)."""
    input:
        data=recognizer_results("data", "{dataset}.npz"),
        model=rules.recognizer_original.output.model,
        shadows=rules.recognizer_shadows.output[0],
        selection=recognizer_selection,
        tuned=recognizer_results("tables", "tuning", "chosen.json"),
        paper=rules.recognizer_experiment.output[0],
    output:
        recognizer_results("runs", "{task}", "{dataset}", "{experiment}", "tuned.parquet"),
    params:
        recognizer=lambda wc: experiment_config(config["recognizer"], wc.task, wc.dataset),
        seed=config["seed"],
    wildcard_constraints:
        task="random_subset|classwise",
        dataset="orl|fashion_mnist",
        experiment=r"(id\d+-)?seed\d+",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/{task}/{dataset}/{experiment}_tuned"),
    benchmark:
        results("benchmarks", "recognizer", "{task}", "{dataset}", "{experiment}_tuned.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_experiment.py"


# Tuning protocol (recognizer.tuning): requests disjoint from the evaluation ones, every method's grid on them, one
# declared rule picks a setting per method.
rule recognizer_tuning_requests:
    input:
        data=recognizer_results("data", "{dataset}.npz"),
        model=rules.recognizer_original.output.model,
        shadows=rules.recognizer_shadows.output[0],
        selection=recognizer_tuning_selection,
    output:
        recognizer_results("tuning", "{task}", "{dataset}", "requests.parquet"),
    params:
        recognizer=lambda wc: recognizer_tuning.job_config(config["recognizer"], wc.task, wc.dataset),
        seed=config["seed"],
    wildcard_constraints:
        task="random_subset|classwise",
        dataset="orl|fashion_mnist",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/tuning/{task}/{dataset}/requests"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_tuning_requests.py"


rule recognizer_tune_method:
    input:
        data=recognizer_results("data", "{dataset}.npz"),
        model=rules.recognizer_original.output.model,
        shadows=rules.recognizer_shadows.output[0],
        requests=rules.recognizer_tuning_requests.output[0],
    output:
        recognizer_results("tuning", "{task}", "{dataset}", "{method}.parquet"),
    params:
        recognizer=lambda wc: recognizer_tuning.job_config(config["recognizer"], wc.task, wc.dataset, wc.method),
        seed=config["seed"],
    wildcard_constraints:
        task="random_subset|classwise",
        dataset="orl|fashion_mnist",
        method="(?!requests$)[a-z0-9_]+",
    threads: config["recognizer"]["threads"]
    log:
        logs("recognizer/tuning/{task}/{dataset}/{method}"),
    benchmark:
        results("benchmarks", "recognizer", "tuning", "{task}", "{dataset}", "{method}.tsv")
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_tune.py"


rule recognizer_tuning_tables:
    input:
        grids=recognizer_tuning_outputs,
        requests=recognizer_tuning_requests_outputs,
    output:
        requests=report(recognizer_results("tables", "tuning", "requests.csv"), category="Recognizer tuning"),
        runs=recognizer_results("tables", "tuning", "runs.csv"),
        grid=report(recognizer_results("tables", "tuning", "grid.csv"), category="Recognizer tuning"),
        choice=recognizer_results("tables", "tuning", "choice.csv"),
        choice_md=report(recognizer_results("tables", "tuning", "choice.md"), category="Recognizer tuning"),
        chosen=recognizer_results("tables", "tuning", "chosen.json"),
    params:
        recognizer=lambda wc: {"tuning": config["recognizer"]["tuning"]},
    log:
        logs("recognizer/tuning/tables"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_tuning_tables.py"


rule recognizer_tune:
    """Target: the recognizer tuning protocol's tables (grid, rule, choice) in tables/tuning/."""
    input:
        rules.recognizer_tuning_tables.output,


rule recognizer_tables:
    input:
        metrics=recognizer_experiment_outputs,
        ulira=recognizer_ulira_outputs,
        originals=lambda wc: expand(rules.recognizer_original.output.info, dataset=recognizer_datasets()),
    output:
        metrics=recognizer_results("tables", "metrics.parquet"),
        metrics_csv=report(recognizer_results("tables", "metrics.csv"), category="Recognizer"),
        costs=report(recognizer_results("tables", "costs.csv"), category="Recognizer"),
        summary=recognizer_results("tables", "summary.parquet"),
        summary_csv=report(recognizer_results("tables", "summary.csv"), category="Recognizer"),
        originals=report(recognizer_results("tables", "original_models.csv"), category="Recognizer"),
        random_subset=recognizer_results("tables", "random_subset.csv"),
        random_subset_md=report(recognizer_results("tables", "random_subset.md"), category="Recognizer"),
        classwise=recognizer_results("tables", "classwise.csv"),
        classwise_md=report(recognizer_results("tables", "classwise.md"), category="Recognizer"),
        plot=report(recognizer_results("figures", "speedup_vs_facc.png"), category="Recognizer"),
    log:
        logs("recognizer/tables"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/recognizer_tables.py"


rule recognizer:
    """Target: the recognizer track's tables (class-wise on ORL, random-subset on ORL and Fashion-MNIST) and plot."""
    input:
        rules.recognizer_tables.output,
