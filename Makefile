# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PACKER := $(VENV)/bin/packer
# torch first, pinned, so the loader extra's open range never pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: install demo test test-fast ci-deps lint screenshot clean

install: $(VENV)/.installed

# constraints.txt: the byte-shaping libraries at the committed demo manifest's versions, so that
# `make demo` on a fresh machine builds the version the README quotes.
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(None if sys.version_info >= (3, 11) else "packer needs Python 3.11 or newer; $(PYTHON) is " + sys.version.split()[0] + ": run make with PYTHON=python3.11 (or newer)")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[loader,dev]"
	touch $@

demo: install
	$(PACKER) demo-data demo-raw --seed 0
	$(PACKER) build workflows/demo.yaml

# Every test, slow ones included (what CI runs); prints the 15 slowest.
test: install
	$(VENV)/bin/pytest --durations=15

# The fast lane: no dask cluster, subprocess build, DDP, S3 server, fuzzing or browser.
test-fast: install
	$(VENV)/bin/pytest -m "not slow" --durations=15

# System packages the suite uses: headless Chromium (tests/test_htmlreport_browser.py, which
# skips without it). Installed only as root with apt-get (CI); elsewhere this says what to do.
ci-deps:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
		echo "ci-deps: chromium is installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "ci-deps: installing chromium with apt-get"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else \
		echo "ci-deps: chromium is missing and this is not root with apt-get; the browser test will skip" \
		     "(install it with: sudo apt-get install -y --no-install-recommends chromium)"; \
	fi

lint: install
	$(VENV)/bin/ruff check packer tests examples benchmarks docs
	$(VENV)/bin/mypy packer
	$(VENV)/bin/lint-imports

# After `make demo`: remake the README's picture of the demo's report (needs chromium: make ci-deps).
screenshot: install
	$(PY) docs/screenshot.py

clean:
	rm -rf build demo-raw .pytest_cache
