# The two commands of the README:  `make run` (default sweep → HTML report)  and  `make test`.
# Override the torch build for a cluster, e.g.  make run TORCH_SPEC="torch==2.13.0 --index-url <CUDA index>"
PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
CORES      ?= 2
SWEEP      ?= workflow/config/default.yaml
PYTEST_ARGS ?=

BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: run test test-equivalence-sse test-floor test-floor-unserial test-floor-serial torch-free venv horovod lint bench bench-slurm slurm-up slurm-down clean docs

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: a range would pull a multi-GB CUDA build onto CPU machines
	$(BIN)/pip install --quiet $(TORCH_SPEC)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(BIN)/.installed

# Optional: Horovod for the `horovod` strategy. Builds a patched 0.28.1 wheel once (minutes), caches it
# under $DDLBENCH_WHEEL_CACHE (default ~/.cache/ddlbench/wheels), then only installs it (seconds).
horovod: venv
	envs/horovod.sh $(VENV)

run: venv
	$(BIN)/snakemake --cores $(CORES) --configfile $(SWEEP)
	@echo "Report: $$($(BIN)/ddlbench plan --configfile $(SWEEP) --report-path | xargs realpath)"

# Two parts: the tests in TEST_WORKERS processes (pytest-xdist; tests/conftest.py keeps a module's tests
# together and runs the SLURM tests one after another on one worker, mostly waiting on the scheduler,
# while the other runs the CPU-bound ones), then the `serial` ones (bounds on timed waits, verdicts over
# timed launches) alone. Exit code 5 (nothing selected) is accepted in the second part only, where a
# selection may leave none of them. Select by marker with TEST_MARKERS (e.g. TEST_MARKERS="not slow";
# a -m in PYTEST_ARGS would replace each part's own).
# BEFORE_SERIAL: a command run between the two parts (CI waits there for what it ran beside the first part).
TEST_WORKERS ?= 2
TEST_MARKERS ?=
BEFORE_SERIAL ?= true
test_and = $(if $(TEST_MARKERS), and ($(TEST_MARKERS)))
test: venv
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not serial$(test_and)" $(PYTEST_ARGS)
	@$(BEFORE_SERIAL)
	$(BIN)/pytest -m "serial$(test_and)" $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The docs site (mkdocs.yml, docs/) into site/, strict: a broken link or anchor, a page left out of the nav, or a
# reference page out of date with the code fails it (`python docs/gen_reference.py` rewrites those pages).
# `make test` builds it too (tests/test_docs.py).
DOCS_SITE ?= site
docs: venv
	$(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

# The equivalence tests (a strategy against its single-process reference) a second time, on the lowest CPU
# capability: ATen's scalar kernels and oneDNN's SSE4.1 ones, where `make test` ran the machine's best
# (AVX2, AVX-512). Two kernel families on every machine: a check that holds by one CPU's rounding fails here.
# CI runs the marked subset (equivalence_sse: the float32 comparisons of every strategy family, the
# sensitivity checks, one float64 check beside its real run; a float64 comparison does not depend on the
# kernels): about 3 min on 2 cores, where all of them take ~17. EQUIVALENCE_SSE=equivalence runs them all.
EQUIVALENCE_SSE ?= equivalence_sse
test-equivalence-sse: venv
	@ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 $(BIN)/python -c "import torch; c = torch.backends.cpu.get_cpu_capability(); assert c == 'DEFAULT', c; print('ATen CPU capability', c)"
	ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 $(BIN)/pytest -m "($(EQUIVALENCE_SSE)) and not slurm and not gpu" $(PYTEST_ARGS)

# The lowest torch the code works with, read from pyproject.toml's "torch>=X" (one source of truth).
# The unit tests (not slow, not SLURM, not GPU; in two parts as in `make test`) and FLOOR_SLOW_TESTS
# (fsdp, zero2, dp_tp and pipelines
# against the single-process reference on real ranks: what older releases get wrong) run against it
# in a venv of its own. PyPI's x86-64 wheels of older torch releases are CUDA builds (5.6 GB
# installed): uv installs them in about 30 s, where pip takes 4 min.
TORCH_FLOOR := $(shell sed -n 's/^ *"torch>=\([0-9.]*\)".*/\1/p' pyproject.toml)
FLOOR_VENV  ?= .venv-floor
FLOOR_SLOW_TESTS ?= tests/test_strategy_sharded.py::test_two_ranks_match_single_process \
                    tests/test_strategy_sharded.py::test_fsdp_on_gpt_tiny \
                    tests/test_strategy_tensor.py::test_dp_tp_on_two_by_two_ranks_matches_single_process \
                    tests/test_strategy_pipeline.py::test_two_stage_pipeline_matches_single_process

# The floor's first part leaves out the modules in tests/torch_free.txt: their tests pass with torch made
# unimportable (in process and in every process they start), so no torch release can change them.
# `make torch-free` writes the list anew (a minute): run it when a module starts or stops using torch.
FLOOR_IGNORE = $(addprefix --ignore=,$(shell cat tests/torch_free.txt))
NO_TORCH_DIR ?= /tmp/ddlbench-no-torch
torch-free: venv
	mkdir -p $(NO_TORCH_DIR)/torch
	echo 'raise ImportError("torch made unimportable by make torch-free")' > $(NO_TORCH_DIR)/torch/__init__.py
	$(BIN)/pytest --collect-only -q -m "not slow and not slurm and not gpu and not serial" -p no:cacheprovider \
	  | sed -n 's/::.*//p' | sort -u > $(NO_TORCH_DIR)/all.txt
	PYTHONPATH=$(NO_TORCH_DIR) $(BIN)/pytest -n $(TEST_WORKERS) -q -rfE -p no:cacheprovider \
	  -m "not slow and not slurm and not gpu and not serial" > $(NO_TORCH_DIR)/run.txt || true
	sed -nE 's/^(FAILED|ERROR) (tests\/[^: ]+\.py).*/\2/p' $(NO_TORCH_DIR)/run.txt | sort -u > $(NO_TORCH_DIR)/torch.txt
	comm -23 $(NO_TORCH_DIR)/all.txt $(NO_TORCH_DIR)/torch.txt > tests/torch_free.txt
	@wc -l < tests/torch_free.txt

$(FLOOR_VENV)/.installed: pyproject.toml | venv
	$(BIN)/pip install --quiet 'uv>=0.5'
	$(BIN)/uv venv --quiet --python $(PYTHON) $(FLOOR_VENV)
	$(BIN)/uv pip install --quiet --python $(FLOOR_VENV)/bin/python torch==$(TORCH_FLOOR)
	$(BIN)/uv pip install --quiet --python $(FLOOR_VENV)/bin/python -e '.[test]'
	touch $@

# test-floor-unserial: all but the `serial` ones (CI runs it beside `make test`'s first part), test-floor-serial:
# those alone on the machine
test-floor: test-floor-unserial test-floor-serial
# The floor leaves out FLOOR_DESELECT too: every model × input × option built on the meta device (314 cases, 75 CPU-s
# of the floor's 476 in CI on 2026-12-07): the floor still builds four model families on the meta device
# (test_meta_init) and runs a real forward and backward pass of every CNN at each norm (test_models' real cases)
FLOOR_DESELECT ?= -k "not test_every_combination_runs_block_by_block_and_reaches_every_parameter"
test-floor-unserial: $(FLOOR_VENV)/.installed
	@$(FLOOR_VENV)/bin/python -c "import torch; v = torch.__version__.split('+')[0]; assert v == '$(TORCH_FLOOR)', v; print('torch', v)"
	$(FLOOR_VENV)/bin/pytest -n $(TEST_WORKERS) -m "not slow and not slurm and not gpu and not serial" $(FLOOR_IGNORE) $(FLOOR_DESELECT) $(PYTEST_ARGS)
	$(FLOOR_VENV)/bin/pytest -m "not slurm and not gpu" $(PYTEST_ARGS) $(FLOOR_SLOW_TESTS)
test-floor-serial: $(FLOOR_VENV)/.installed
	$(FLOOR_VENV)/bin/pytest -m "serial and not slow and not slurm and not gpu" $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: venv
	$(BIN)/ruff check ddlbench tests benchmarks docs
	$(BIN)/ruff format --check ddlbench tests benchmarks docs
	$(BIN)/snakemake --lint --cores 2
	$(BIN)/snakemake -s workflow/calibrate.smk --lint --cores 2
	$(BIN)/snakemake -s workflow/adaptive.smk --lint --cores 2

bench: venv
	$(BIN)/python benchmarks/plan_speed.py

# the analytical model against measurements: calibrate, run a sweep of every 2-rank strategy, print accuracies
.PHONY: bench-analytic
bench-analytic: venv
	$(BIN)/python benchmarks/analytic_accuracy.py

# empirical models' extrapolation on public scaling tables: ddlbench beside Extra-P 4.2.5 (its own venv)
.PHONY: bench-empirical
bench-empirical: venv
	$(BIN)/python benchmarks/empirical_accuracy.py

# a 10,000-point sweep finished: `ddlbench report --configfile` and render times (subprocesses, median of 3), report.html's size
.PHONY: bench-report
bench-report: venv
	$(BIN)/python benchmarks/report_speed.py

# ddlbench's kernel against a bare hand-written DDP loop, alternated; prints samples/s and the ratio
.PHONY: bench-overhead
bench-overhead: venv
	$(BIN)/python benchmarks/overhead.py $(OVERHEAD_ARGS)

# sparse (adaptive) sampling against the full sweep, both measured here: cost saved, accuracy lost
.PHONY: bench-sampling
bench-sampling: venv
	$(BIN)/python benchmarks/sampling_accuracy.py

# every benchmark above at its smallest size (minutes; their figures mean nothing there): what CI runs
.PHONY: bench-quick
bench-quick: venv
	$(BIN)/pytest tests/test_benchmarks.py $(PYTEST_ARGS)

# A real SLURM cluster on this host (root; Debian packages): 4 nodes, partitions cpu and gpu.
# `make slurm-up` is idempotent and prints the `export SLURM_CONF=...` line a shell needs.
slurm-up:
	tests/cluster/slurm.sh up

slurm-down:
	tests/cluster/slurm.sh down

bench-slurm: venv
	$(BIN)/python benchmarks/scheduler_load.py

clean:
	rm -rf results/*/ .snakemake
