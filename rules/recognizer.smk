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


rule recognizer_tables:
    input:
        metrics=recognizer_experiment_outputs,
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
