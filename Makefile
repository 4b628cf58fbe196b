# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PACKER := $(VENV)/bin/packer
# torch first, pinned, so the loader extra's open range never pulls a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: install demo test lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[loader,dev]"
	touch $@

demo: install
	$(PACKER) demo-data demo-raw --seed 0
	$(PACKER) build workflows/demo.yaml

test: install
	$(VENV)/bin/pytest

lint: install
	$(VENV)/bin/ruff check packer tests examples benchmarks
	$(VENV)/bin/mypy packer

clean:
	rm -rf build demo-raw .pytest_cache
