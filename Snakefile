# idunlearn: make face models forget a person, measure how well, and what it cost everyone else.
# Stages live in rules/<stage>.smk; their scripts in workflow/scripts/ call the idunlearn package.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/faces.smk"
include: "rules/identities.smk"
include: "rules/selection.smk"
include: "rules/generator.smk"
include: "rules/layer_analysis.smk"
include: "rules/unlearning.smk"
include: "rules/evaluation.smk"
include: "rules/aggregate.smk"
include: "rules/study.smk"
include: "rules/audit.smk"
include: "rules/tuning.smk"
include: "rules/export.smk"
# Forgetting many people (joint and sequential unlearning); its target `many` is not part of the default target.
include: "rules/many.smk"
# Rebuild (remove a batch of people by distillation into a noised copy); target `rebuild`, not in the default target.
include: "rules/rebuild.smk"
# Forget requests (config `request`, config/request.yaml): when one is configured it is the default target.
include: "rules/request.smk"
# Recognizer track (GSUO on classifiers); its target `recognizer` is not part of the default target.
include: "rules/recognizer.smk"


rule all:
    input:
        get_final_outputs,
    default_target: True


onsuccess:
    print(f"idunlearn: tables in {results('tables')}, figures in {results('figures')}; "
          f"build the HTML report with: snakemake --report {results('report.html')}")
