# Stage "acquire dataset": images on disk plus a checksummed manifest.


rule acquire_dataset:
    output:
        manifest=results("data", "manifest.parquet"),
    params:
        dataset=config["dataset"],
        cache_dir=ASSETS,
        image_dir=image_dir(),
    log:
        logs("acquire_dataset"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/acquire_dataset.py"
