# Two commands a new user needs: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is pinned here (CPU wheel on CPU machines, the normal CUDA build on GPU machines).
TORCH_PIN ?= torch==2.13.0

.PHONY: setup test test-all demo bench docs docs-serve mutate records-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# -n auto: one pytest-xdist worker per core (at most 8: each holds ~1 GB by the end), tests
# handed out as workers free up; each worker and the processes its tests start get
# cores/workers threads (tests/conftest.py).
test: setup
	$(PY) -m pytest -q -n auto --maxprocesses 8 --dist worksteal

test-all: setup
	$(PY) -m pytest -q -n auto --maxprocesses 8 --dist worksteal -m "not gpu"

# The quick study, then its report (final pairs analysed; milestones for the spectra
# dynamics). The last line printed is the path of report.html.
demo: setup
	$(VENV)/bin/sanlab study run examples/quick.toml --out runs/quick --report

bench: setup
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# The documentation site (mkdocs.yml, docs/) into site/; warnings are errors.
docs: setup
	@$(PY) -c "import mkdocs, material, mkdocstrings" 2>/dev/null || $(PY) -m pip install -q -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs-serve: docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve
# Plant known bugs one at a time and check the tests catch each (scripts/mutate.py; not part of `make test`).
mutate: setup
	$(PY) scripts/mutate.py

# Every committed record's README tables equal its committed results (docs/records.md).
records-check: setup
	$(VENV)/bin/sanlab record check records

clean:
	rm -rf $(VENV) runs site .pytest_cache
