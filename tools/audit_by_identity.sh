#!/usr/bin/env bash
# The study's robust audit one forget identity at a time, each identity's finished jobs added to the job archive as
# soon as its jobs end, so that a run stopped at any point leaves everything finished so far in the archive
# (docs/audit.md, "Resuming on another machine"). Restores the archive first, so that it also continues a run
# begun on another machine.
#
#   tools/audit_by_identity.sh [identity ...]    default: every forget identity, in the selection's order
#   tools/audit_by_identity.sh --stop            let the running jobs finish, start no more, archive them, end
#                                                (during the tuning: no lane starts; the tuning's jobs stay here)
#
# Environment: RUNS (unlearning runs audited), EXTERNAL (external models audited), CONFIG (config files), ARCHIVE,
# RESULTS (their results_dir), CORES, LANES. The defaults are config/robust.yaml's audit.runs and 2 lanes: the
# identities are dealt round-robin to LANES queues that run side by side with CORES / LANES cores each, so that no
# core waits while one identity's last job ends (one Snakemake run per identity cannot fill both cores then).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-.venv/bin/python}
CONFIG=${CONFIG:-"config/study.yaml config/robust.yaml"}
ARCHIVE=${ARCHIVE:-data/shipped/job-archives/study-robust}
RUNS=${RUNS:-"piu_100 piu_meta piu_robust uce.tuned esd.tuned"}
EXTERNAL=${EXTERNAL:-retrain}
CORES=${CORES:-2}
LANES=${LANES:-2}
RESULTS=${RESULTS:-results}
LOCK=.snakemake/audit_by_identity.lock
# asks the lanes to stop; each lane's Snakemake PID in $STOP.<lane>.pid, the tuning's in $STOP.tuning.pid
STOP=.snakemake/audit_by_identity.stop

snakemake() { "$PY" -m snakemake "$@" --configfile $CONFIG; }
# The lanes' saves take turns: each rewrites the archive's manifest.
save() { flock "$LOCK" "$PY" -m idunlearn archive save --archive "$ARCHIVE" --results "$RESULTS"; }

if [ "${1:-}" = "--stop" ]; then
    # SIGTERM makes Snakemake finish the jobs it is running and start no more; the lanes then archive and end.
    touch "$STOP"
    for pid_file in "$STOP".*.pid; do
        [ -f "$pid_file" ] && kill -TERM "$(cat "$pid_file")" 2> /dev/null || true
    done
    echo "asked the lanes to stop (or the tuning, while it runs): they end when their running jobs do, and archive them"
    exit 0
fi

stoppable() {  # stoppable NAME ARG...: Snakemake with ARG..., its PID in $STOP.NAME.pid for --stop; its exit status
    local name=$1 pid status=0
    shift
    "$PY" -m snakemake "$@" --configfile $CONFIG &
    # Not the snakemake function above: a function in the background is a subshell, and --stop's SIGTERM must
    # reach Snakemake itself; a simple command in the background is its own process.
    pid=$!
    echo "$pid" > "$STOP.$name.pid"
    wait "$pid" || status=$?
    rm -f "$STOP.$name.pid"
    return "$status"
}

lane() {  # lane $1 runs the identities $2... one after another on CORES / LANES cores
    local n=$1 identity status
    shift
    for identity in "$@"; do
        if [ -e "$STOP" ]; then
            echo "== stopped on request before identity $identity"
            return 0
        fi
        echo "== identity $identity ($(date))"
        local targets=("$RESULTS/audit/before/$identity/rows.parquet")
        for run in $RUNS; do targets+=("$RESULTS/audit/after/$run/$identity/rows.parquet"); done
        for name in $EXTERNAL; do targets+=("$RESULTS/audit/external/$name/$identity/rows.parquet"); done
        status=0
        # Lanes share the working directory, so Snakemake's lock is off; their jobs are disjoint (each identity's
        # own), and the shared inputs were built before the lanes start.
        stoppable "$n" --cores $((CORES / LANES)) --nolock --keep-going "${targets[@]}" || status=$?
        save
        if [ -e "$STOP" ]; then
            echo "== stopped on request during identity $identity: its finished jobs are archived"
            return 0
        elif [ "$status" -ne 0 ]; then
            echo "identity $identity: a job failed (exit $status); its log names it" >&2
            return "$status"
        fi
    done
}

if [ "$LANES" -lt 1 ] || [ $((CORES / LANES)) -lt 1 ]; then
    echo "LANES=$LANES with CORES=$CORES: each lane needs at least one core; set LANES between 1 and CORES" >&2
    exit 2
fi
mkdir -p .snakemake
rm -f "$STOP" "$STOP".*.pid
echo "== shared inputs ($(date))"
snakemake --cores "$CORES" audit_inputs
if [ -f "$ARCHIVE/MANIFEST.json" ]; then
    "$PY" -m idunlearn archive restore --archive "$ARCHIVE"
fi
if [ $# -eq 0 ]; then
    set -- $("$PY" -c "import pandas as pd, sys
print(' '.join(str(i) for i in pd.read_parquet(sys.argv[1])['forget_identity']))" \
        "$RESULTS/selection/selections.parquet")
fi
if [ "$RUNS" != "${RUNS/.tuned/}" ] && [ "$LANES" -gt 1 ]; then
    # A tuned run needs the tuning's choice, which every lane would build: build it once, first. --stop ends it as it
    # ends a lane; its finished jobs stay in $RESULTS (only the choice is archived, so they resume on this machine).
    status=0
    stoppable tuning --cores "$CORES" "$RESULTS/tables/tuning/choice.json" || status=$?
    if [ -e "$STOP" ]; then
        rm -f "$STOP"
        echo "== stopped on request during the tuning ($(date)); its finished jobs are in $RESULTS/tuning"
        exit 0
    elif [ "$status" -ne 0 ]; then
        exit "$status"
    fi
    save
fi
identities=("$@")
pids=()
for ((n = 0; n < LANES; n++)); do
    queue=()
    for ((i = n; i < ${#identities[@]}; i += LANES)); do queue+=("${identities[i]}"); done
    if [ ${#queue[@]} -gt 0 ]; then
        lane "$n" "${queue[@]}" > >(sed -u "s/^/[lane $n] /") 2>&1 &
        pids+=($!)
    fi
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if [ "$failed" -ne 0 ]; then
    echo "a lane stopped at a failed job; the finished jobs are in $ARCHIVE" >&2
    exit 1
elif [ -e "$STOP" ]; then
    rm -f "$STOP"
    echo "== stopped on request ($(date)); the finished jobs are in $ARCHIVE"
    exit 0
fi
echo "== done ($(date)); the tables: snakemake audit --cores $CORES --configfile $CONFIG"
