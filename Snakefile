# idunlearn: make face models forget a person, measure how well, and what it cost everyone else.
# Stages live in rules/<stage>.smk; their scripts in workflow/scripts/ call the idunlearn package.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/faces.smk"
include: "rules/identities.smk"
include: "rules/selection.smk"


rule all:
    input:
        get_final_outputs,
    default_target: True
