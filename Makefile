# etl: see README.md. Every target creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SRC ?= examples/raw/
DST ?= parquet/
# Unset variables pass no flag, so a CONFIG file's tokenizer/template/seq_len/input type stay in
# force (defaults: the built-in byte tokenizer, the template `auto`: ngpt for it, the tokenizer's
# own chat_template (hf) for a tokenizer that has one; S = 2048; input type chat).
SEQ_LEN ?=
TOKENIZER ?=
TEMPLATE ?=
INPUT_TYPE ?=
CONFIG ?=
ETL_FLAGS = $(if $(CONFIG),--config $(CONFIG)) $(if $(TOKENIZER),--tokenizer $(TOKENIZER)) \
	$(if $(TEMPLATE),--template $(TEMPLATE)) $(if $(SEQ_LEN),--seq-len $(SEQ_LEN)) \
	$(if $(INPUT_TYPE),--input-type $(INPUT_TYPE))

.PHONY: venv etl test stats bench lint docs clean

venv: $(STAMP)

# compileall: bytecode now, as a wheel install does: an editable install compiles none, and where
# PYTHONDONTWRITEBYTECODE is set pip compiles nothing either, so every `etl` start recompiled what it
# imports (~0.4 s of `etl run`'s start-up, ~0.85 s when pandas is imported); ~30 s once on 2 cores.
# The venv's pass skips torch's py312_intrinsics.py (Python 3.12 syntax, imported by no 3.11 code):
# with it compileall exits 1 and a '-' prefix made make print "Error 1 (ignored)" on every install.
# Bytecode is start-up speed only, so any other file that fails is no reason to fail the install
# either (`|| true`, with -qq silent).
$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/python -m compileall -q etl
	$(BIN)/python -m compileall -qq -j 0 -x '/torch/testing/_internal/py312_' $(VENV)/lib || true
	touch $(STAMP)

etl: $(STAMP)
	$(BIN)/etl run $(SRC) $(DST) $(ETL_FLAGS)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests

stats: $(STAMP)
	$(BIN)/etl stats $(DST)

# Every figure in one run -> bench/results.md. One-topic scripts (etl_throughput, builders_throughput,
# loader_throughput, big_record, hot_path, packing, unread_fields, preference) run on their own:
# python bench/X.py.
bench: $(STAMP)
	$(BIN)/python bench/results.py

lint: $(STAMP)
	$(BIN)/ruff check etl tests bench examples

# The documentation site (mkdocs.yml, docs/) -> site/; --strict fails on a broken link or anchor.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) parquet/ .pytest_cache site/
