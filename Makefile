# Run `make help` for the targets. Every target installs the project into .venv first (see `setup`).
SHELL := /bin/bash
PY := .venv/bin/python
EXTDATA ?= ../shared/extdata
GPU ?=
DEVICE ?=
OPS ?=
PRECISIONS ?=
N ?=
SEED ?=
OUT ?=
OP ?=
ARGS ?=
MODEL ?= resnet50
BATCH ?= 64
PRECISION ?= fp32
GPUS ?= a100,h100,l4,t4
NGPUS ?=
INTERCONNECT ?=
TIME_LIMIT_S ?=

.DEFAULT_GOAL := help
.PHONY: help setup collect collect-collectives fit-collectives import train evaluate predict predict-step test \
	lint mlflow-ui clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[train,dev]'
	touch $@

setup: .venv/.installed ## Create .venv and install the project with the training stack and test tools

collect: setup ## Sweep op timings on this host's GPUs: make collect GPU=h200 [DEVICE=cuda|cuda:N|cpu OPS=a,b PRECISIONS=fp32,bf16 N=2000 SEED=0 OUT=datasets/]
	@test -n "$(GPU)" || { echo "GPU=<label> is required, e.g. make collect GPU=h200"; exit 2; }
	$(PY) -m pipeline.collect gpu=$(GPU) $(if $(DEVICE),device=$(DEVICE)) $(if $(OPS),'ops=[$(OPS)]') \
		$(if $(PRECISIONS),'precisions=[$(PRECISIONS)]') $(if $(N),n=$(N)) $(if $(SEED),seed=$(SEED)) \
		$(if $(OUT),out=$(OUT)) $(ARGS)

collect-collectives: setup ## Time all-reduce/reduce-scatter/all-gather on this host's GPUs (NVLink/PCIe and host path): make collect-collectives GPU=h200 [TIME_LIMIT_S=300 ARGS='--counts 2']
	@test -n "$(GPU)" || { echo "GPU=<label> is required, e.g. make collect-collectives GPU=h200"; exit 2; }
	$(PY) -m pipeline.collectives collect --gpu $(GPU) $(if $(OUT),--out $(OUT)/collectives) \
		$(if $(TIME_LIMIT_S),--time-limit-s $(TIME_LIMIT_S)) $(ARGS)

fit-collectives: setup ## Fit the collective model (conf/collectives_model.yaml) and write reports/collectives.md
	$(PY) -m pipeline.collectives fit $(ARGS)

import: setup ## Import the public measurements (EXTDATA=../shared/extdata) into datasets/external/
	$(PY) -m pipeline.ingest extdata=$(EXTDATA) $(ARGS)

train: setup ## Train and publish the per-op scalers (OP=bmm or OP=bmm,lstm) on every dataset under datasets/
	$(PY) -m pipeline.train $(if $(OP),'op=[$(OP)]') $(ARGS)

evaluate: setup ## Write the evaluation report (leave-one-GPU-out, ratio mode, per precision/phase)
	$(PY) -m pipeline.evaluation $(if $(OP),'op=[$(OP)]') $(ARGS)

predict: setup ## Predict op times: make predict ARGS='conv2d --config batch=32,in_channels=64,... --gpus h100,l4'
	$(PY) -m pipeline.predict $(ARGS)

predict-step: setup ## Predict a training step on other GPUs: make predict-step MODEL=resnet50 BATCH=64 PRECISION=bf16 GPUS=a100,h100 [NGPUS=1,2,4,8 INTERCONNECT=auto|nvlink|pcie|host]
	$(PY) -m pipeline.step --model $(MODEL) --batch $(BATCH) --precision $(PRECISION) --gpus $(GPUS) \
		$(if $(NGPUS),--ngpus $(NGPUS)) $(if $(INTERCONNECT),--interconnect $(INTERCONNECT)) $(ARGS)

test: setup ## Run the test suite (CPU; GPU tests skip without CUDA; skipped tests are listed with their reasons)
	$(PY) -m pytest -q $(ARGS)

lint: setup ## Check the code with ruff (configuration in pyproject.toml)
	$(PY) -m ruff check .

mlflow-ui: ## Browse the MLflow runs (installs full mlflow into .venv-ui)
	test -x .venv-ui/bin/mlflow || { python3 -m venv .venv-ui && .venv-ui/bin/pip install --quiet 'mlflow==3.17.2'; }
	.venv-ui/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db --port 5000

clean: ## Remove caches and Hydra run folders (keeps datasets/ and checkpoints/)
	rm -rf outputs multirun .pytest_cache
