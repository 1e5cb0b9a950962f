#!/usr/bin/env bash
# The GPU check on a GPU host that has Python, torch and transformers but no package index (a bare cluster node or a
# lent GPU image): wheels are downloaded on a host with PyPI, carried over, installed into a temporary folder, and
# the three GPU measurements run one after another, each under its own time limit, so a slow torch.compile never
# costs the eager record.
#
#   tools/gpu_check_offline.sh download WHEELS   # on a host with PyPI: the packages a torch image lacks
#   tools/gpu_check_offline.sh run WHEELS OUT    # on the GPU host, in the repository root
#
# `run` writes OUT/env.txt (GPU, versions), OUT/gpu_eager.json (make gpu-check, torch.compile off), OUT/piu_paper_fp32.json
# (PIU steps at the paper recipe in fp32, config/celebahq.yaml's precision) and OUT/gpu_compile.json (compile on),
# each with its log. Limits in seconds: EAGER_LIMIT (250), FP32_LIMIT (70), COMPILE_LIMIT (190).
set -uo pipefail

# diffusers and jsonschema (with their own needs) are what the idunlearn package imports beyond a torch image
WHEELS_NEEDED=(diffusers==0.42.1 importlib_metadata==10.2.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
               referencing==0.37.0 rpds-py==2026.9.1 tflite==2.18.0 truststore==0.10.5 backports.strenum==1.2.8)

case "${1:-}" in
download)
    wheels=${2:?usage: $0 download WHEELS}
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$wheels" "${WHEELS_NEEDED[@]}"
    ;;
run)
    wheels=${2:?usage: $0 run WHEELS OUT} out=${3:?usage: $0 run WHEELS OUT}
    mkdir -p "$out"
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl || {
        echo "gpu_check_offline: installing the wheels in $wheels failed; run '$0 download $wheels' on a host with PyPI" >&2
        exit 2; }
    export PYTHONPATH="$site:src" PYTHONUNBUFFERED=1
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
      python3 -c "import torch, transformers, diffusers, pandas, numpy; print('torch', torch.__version__,
'transformers', transformers.__version__, 'diffusers', diffusers.__version__, 'pandas', pandas.__version__,
'numpy', numpy.__version__)"; } 2>&1 | tee "$out/env.txt"
    timeout "${EAGER_LIMIT:-250}" python3 -m idunlearn.gpu_check --no-compile --steps 10 \
        --output "$out/gpu_eager.json" > "$out/eager.log" 2>&1
    echo "eager: exit $?"; tail -n 5 "$out/eager.log"
    timeout "${FP32_LIMIT:-70}" python3 -m idunlearn benchmark-piu --preset paper --device cuda --dtype fp32 \
        --steps 5 --warmup 2 --output "$out/piu_paper_fp32.json" > "$out/fp32.log" 2>&1
    echo "fp32 PIU steps: exit $?"; tail -n 3 "$out/fp32.log"
    timeout "${COMPILE_LIMIT:-190}" python3 -m idunlearn.gpu_check --compile-only --steps 10 \
        --output "$out/gpu_compile.json" > "$out/compile.log" 2>&1
    echo "compile: exit $?"; tail -n 5 "$out/compile.log"
    ;;
*)
    echo "usage: $0 download WHEELS | run WHEELS OUT" >&2
    exit 2
    ;;
esac
