# meshc — build, test and regenerate derived files. `make help` lists the targets.
CARGO ?= cargo
MESHC := target/release/meshc
DEMO := testdata/transformer

.PHONY: help build test golden testdata bench demo fmt lint clean

help:
	@echo "make demo      build meshc and run the transformer-block example end to end"
	@echo "make test      run every test (unit, property, golden, CLI)"
	@echo "make golden    rewrite golden/ from the current outputs (review the diff!)"
	@echo "make testdata  regenerate testdata/ with numpy (pip install numpy)"
	@echo "make bench     run the benchmarks"

build:
	$(CARGO) build --release

test:
	$(CARGO) test --workspace

golden:
	MESHC_BLESS=1 $(CARGO) test --test golden
	git status --short golden/

testdata:
	python3 tools/gen_testdata.py

bench:
	@echo "no benchmarks yet: the compiled paths arrive with the codegen issue"

demo: build
	$(MESHC) check $(DEMO)/graph.json
	$(MESHC) fmt $(DEMO)/graph.json --to text | head -n 40
	$(MESHC) interp $(DEMO)/graph.json \
	    $(foreach f,$(sort $(wildcard $(DEMO)/inputs/*.npy)),--input $(basename $(notdir $(f)))=$(f)) \
	    --output-dir out/demo
	$(MESHC) interp $(DEMO)/graph.json \
	    $(foreach f,$(sort $(wildcard $(DEMO)/inputs/*.npy)),--input $(basename $(notdir $(f)))=$(f))

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
	rm -rf out
