# Stage "layer analysis": identity separation of every cross-attention layer of the generator (PIU Section 3.4,
# Fig. 3), the evidence behind the surgical layer set. Needs the mini generator checkpoint.


rule layer_analysis:
    input:
        embeddings=results("faces", "embeddings.parquet"),
        labels=results("identities", "labels.parquet"),
        model=os.path.join(config["generator"]["mini"]["checkpoint"], "model.safetensors"),
        model_config=os.path.join(config["generator"]["mini"]["checkpoint"], "config.json"),
    output:
        table=results("analysis", "layer_separation.parquet"),
        csv=results("analysis", "layer_separation.csv"),
        figure=report(results("analysis", "layer_separation.png"), category="Layer analysis"),
    params:
        analysis=config["layer_analysis"],
    threads: 2
    log:
        logs("layer_analysis"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/layer_analysis.py"
