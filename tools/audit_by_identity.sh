#!/usr/bin/env bash
# The study's robust audit one forget identity at a time, each identity's finished jobs added to the job archive as
# soon as its jobs end, so that a run stopped at any point leaves everything finished so far in the archive
# (docs/audit.md, "Resuming on another machine"). Restores the archive first, so that it also continues a run
# begun on another machine.
#
#   tools/audit_by_identity.sh [identity ...]    default: every forget identity, in the selection's order
#
# Environment: RUNS (unlearning runs audited), EXTERNAL (external models audited), CONFIG (config files), ARCHIVE,
# RESULTS (their results_dir), CORES. The defaults are config/robust.yaml's audit.runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-.venv/bin/python}
CONFIG=${CONFIG:-"config/study.yaml config/robust.yaml"}
ARCHIVE=${ARCHIVE:-data/shipped/job-archives/study-robust}
RUNS=${RUNS:-"piu_100 piu_meta piu_robust uce.tuned esd.tuned"}
EXTERNAL=${EXTERNAL:-retrain}
CORES=${CORES:-2}
RESULTS=${RESULTS:-results}

snakemake() { "$PY" -m snakemake --cores "$CORES" "$@" --configfile $CONFIG; }

echo "== shared inputs ($(date))"
snakemake audit_inputs
if [ -f "$ARCHIVE/MANIFEST.json" ]; then
    "$PY" -m idunlearn archive restore --archive "$ARCHIVE"
fi
if [ $# -eq 0 ]; then
    set -- $("$PY" -c "import pandas as pd, sys
print(' '.join(str(i) for i in pd.read_parquet(sys.argv[1])['forget_identity']))" \
        "$RESULTS/selection/selections.parquet")
fi
for identity in "$@"; do
    echo "== identity $identity ($(date))"
    targets=("$RESULTS/audit/before/$identity/rows.parquet")
    for run in $RUNS; do targets+=("$RESULTS/audit/after/$run/$identity/rows.parquet"); done
    for name in $EXTERNAL; do targets+=("$RESULTS/audit/external/$name/$identity/rows.parquet"); done
    status=0
    snakemake --keep-going "${targets[@]}" || status=$?
    "$PY" -m idunlearn archive save --archive "$ARCHIVE" --results "$RESULTS"
    if [ "$status" -ne 0 ]; then
        echo "identity $identity: a job failed (exit $status); its log names it" >&2
        exit "$status"
    fi
done
echo "== done ($(date)); the tables: snakemake audit --cores $CORES --configfile $CONFIG"
