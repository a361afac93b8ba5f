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

.PHONY: setup book book-strict test test-lib test-notebooks test-browser browser-deps checks clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

# The everyday build: notebooks re-executed only when they changed (jupyter-cache).
book: setup
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# The CI build: a clean tree, so every notebook is executed against the current lib/ (no stale cache).
book-strict: setup
	$(VENV)/bin/jupyter-book clean . --all >/dev/null
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

checks: setup
	$(PY) -m servelab.checks

test-lib: setup
	$(PY) -m pytest -q tests

test-notebooks: setup
	@if ls notebooks/*.ipynb notebooks/*/*.ipynb >/dev/null 2>&1; then \
	  $(PY) -m pytest -q --nbval-lax --nbval-sanitize-with notebooks/sanitize.cfg notebooks; \
	else echo "no notebooks yet"; fi

browser-deps:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test-browser: setup browser-deps
	$(PY) -m pytest -q browser_tests

test: setup checks test-lib test-notebooks book-strict test-browser

clean:
	rm -rf _build
