# Stage "export" (target `export`, not in the default target: a full UNet per job, 3.4 GB on the paper path): each
# (run, forget identity)'s unlearned UNet as a diffusers folder, its delta against the base with the base's hash,
# and a manifest of both hashes (models/export.py says what the hash covers).


rule export_unlearned:
    input:
        changed=rules.unlearn.output.changed,
        generator=generator_files(),
    output:
        unet=unet_folder_files(results("export", "{run}", "{identity}", "unet")),
        delta=results("export", "{run}", "{identity}", "delta.safetensors"),
        manifest=results("export", "{run}", "{identity}", "manifest.json"),
    params:
        generator=config["generator"],
    threads: 1
    resources:
        mem_mb=8000,
    log:
        logs("export/{run}/{identity}"),
    conda:
        "../environment.yml"
    script:
        "../workflow/scripts/export.py"


rule export:
    input:
        lambda wc: [expand(rules.export_unlearned.output.manifest, run=run, identity=identity)[0]
                    for run, identity in run_identity_pairs()],
