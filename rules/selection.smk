# Stage "select experiments": forget identities, splits and anchors. A checkpoint writing one small file per
# forget identity, so that adding an identity runs only that identity's downstream jobs.


checkpoint select_experiments:
    input:
        labels=rules.cluster_identities.output.labels,
        centroids=rules.cluster_identities.output.centroids,
    output:
        table=results("selection", "selections.parquet"),
        csv=results("selection", "selections.csv"),
        identities=directory(results("selection", "identities")),
    params:
        selection=config["selection"],
        seed=config["seed"],
    log:
        logs("select_experiments"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/select_experiments.py"


rule identity_sheet:
    input:
        selection=selection_file,
        labels=rules.cluster_identities.output.labels,
        manifest=rules.acquire_dataset.output.manifest,
    output:
        report(results("selection", "sheets", "{identity}.png"), category="Forget identities"),
    log:
        logs("identity_sheet/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/identity_sheet.py"


rule identity_stages:
    """Target: everything up to the experiment selection (no generator needed)."""
    input:
        results("identities", "summary.csv"),
        results("identities", "nn_histogram.png"),
        results("selection", "selections.csv"),
        lambda wc: expand(results("selection", "sheets", "{identity}.png"), identity=forget_identities()),
