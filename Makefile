# Two commands do all the set-up on a fresh Debian 12 machine (as root for the eBPF parts):
#   make demo   system packages, .venv, the package, then `sits-observe demo`
#   make test   the same set-up (plus test tools), then the whole test suite
#   make help   these and the other targets
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTHON ?= python3
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: help demo test system-demo system-test venv bench clean
# one step at a time, also under `make -j` or MAKEFLAGS=-jN: the venv needs python3-venv, which system-* installs
.NOTPARALLEL:

demo: system-demo venv
	$(VENV)/bin/sits-observe demo $(DEMO_ARGS)

test: system-test venv
	$(PY) -m pytest $(PYTEST_ARGS)

system-demo:
	@bash .ci/setup-system.sh demo

system-test:
	@bash .ci/setup-system.sh test

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: the CPU build on disk, never an unpinned CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	# bcc is not on PyPI: expose Debian's python3-bpfcc module (and only it) to the venv
	@if [ -d /usr/lib/python3/dist-packages/bcc ]; then \
	  ln -sfn /usr/lib/python3/dist-packages/bcc "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc"; \
	else echo "venv: python3-bpfcc not installed; eBPF probes will be off"; fi
	touch $@

bench: venv
	$(VENV)/bin/sits-observe bench pipeline --json

clean:
	rm -rf $(VENV) build dist *.egg-info

help:
	@echo "make demo     system packages (as root), .venv, the package, then sits-observe demo (DEMO_ARGS=...)"
	@echo "make test     the same set-up plus test tools, then the whole test suite (PYTEST_ARGS=...)"
	@echo "make venv     only .venv: torch==2.13.0 first, the package (editable) with its test extras, bcc linked in"
	@echo "make bench    sits-observe bench pipeline --json"
	@echo "make clean    remove .venv, build/, dist/ and *.egg-info"
