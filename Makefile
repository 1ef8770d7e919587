# smith-fast: `make serve` and `make test` set everything up from a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
SOCK   ?= $(CURDIR)/.smith-fast.sock
TCP    ?= 127.0.0.1:7878

.PHONY: serve test bench bench-micro install clean proto

$(VENV)/.deps: requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -U pip
	$(PIP) install -r requirements-dev.txt
	touch $@

# --no-build-isolation: build with the Cython pinned in requirements-dev.txt, already in the venv.
$(VENV)/.build: $(VENV)/.deps setup.py $(wildcard csrc/*.pyx csrc/*.pxd csrc/*_c.py smith_fast/*_py.py)
	$(PIP) install --no-build-isolation -e .
	touch $@

install: $(VENV)/.build

serve: install
	@echo "smith-fast: serving on unix:$(SOCK) and tcp:$(TCP) (Ctrl-C to stop)" >&2
	@echo "  try: $(VENV)/bin/smith-fast ping --connect unix:$(SOCK)" >&2
	$(VENV)/bin/smith-fast serve --unix $(SOCK) --tcp $(TCP)

test: install
	$(VENV)/bin/pytest

bench-micro: install
	$(VENV)/bin/pytest bench --benchmark-only -p no:cacheprovider

proto: $(VENV)/.deps
	$(PY) proto/generate.py

clean:
	rm -rf build $(VENV) csrc/*.c smith_fast/*.so *.egg-info
