# Stage "layer analysis": identity separation of every cross-attention layer of the configured generator (PIU
# Section 3.4, Fig. 3, on Arc2Face), the evidence behind the surgical layer set.


rule layer_analysis:
    input:
        embeddings=results("faces", "embeddings.parquet"),
        labels=results("identities", "labels.parquet"),
        generator=generator_files(),
    output:
        table=results("analysis", "layer_separation.parquet"),
        csv=results("analysis", "layer_separation.csv"),
        figure=report(results("analysis", "layer_separation.png"), category="Layer analysis"),
    params:
        analysis=config["layer_analysis"],
        generator=config["generator"],
        device=config["unlearning"]["device"],
    threads: 2
    log:
        logs("layer_analysis"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/layer_analysis.py"
