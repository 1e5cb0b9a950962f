# Stage "cluster identities": DBSCAN over the embeddings, centroids, summary and the nearest-neighbour histogram
# (all-pairs steps in float32 row blocks: bounded memory at CelebA-HQ size, 28,000 embeddings).


rule cluster_identities:
    input:
        embeddings=rules.extract_embeddings.output.embeddings,
        manifest=rules.acquire_dataset.output.manifest,
    output:
        labels=results("identities", "labels.parquet"),
        centroids=results("identities", "centroids.parquet"),
        summary=results("identities", "summary.parquet"),
        summary_csv=results("identities", "summary.csv"),
        histogram=results("identities", "nn_histogram.parquet"),
        histogram_png=report(results("identities", "nn_histogram.png"), category="Identities"),
    params:
        identities=config["identities"],
    log:
        logs("cluster_identities"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/cluster_identities.py"
