#!/usr/bin/env bash
# The seed corpora of the cargo fuzz targets (fuzz/corpus/TARGET/, not committed; libFuzzer
# adds what it finds there): the small files of testdata/ each target reads, the inputs
# found before (testdata/fuzz-regressions/TARGET/), and for `artifact` a few testdata graphs
# (one over a symbolic batch) compiled by MESHC (default target/release/meshc). Run again, it adds what is new.
set -euo pipefail
cd "$(dirname "$0")/.."
MESHC=${MESHC:-target/release/meshc}
corpus=fuzz/corpus

# seed TARGET FILE...: copies each file of at most 1 MB, named by its path.
seed() {
    local target=$1
    shift
    mkdir -p "$corpus/$target"
    for f in "$@"; do
        [ "$(stat -c %s "$f")" -le 1048576 ] || continue
        cp "$f" "$corpus/$target/$(echo "$f" | tr / _)"
    done
}
files() { find "$@" -type f -print0 | sort -z | xargs -0 -r printf '%s\n'; }

mapfile -t onnx < <(files testdata -name '*.onnx')
mapfile -t st < <(files testdata -name '*.safetensors')
mapfile -t index < <(files testdata -name '*.index.json')
mapfile -t npy < <(files testdata -name '*.npy' -size -64k)
mapfile -t text < <(files testdata tests/passes -name '*.txt' ! -name README.md)
mapfile -t json < <(files testdata \( -name graph.json -o -path 'testdata/bad/*.json' -o -path 'testdata/regress/*.json' \))
seed onnx_import "${onnx[@]}"
seed safetensors "${st[@]}"
seed checkpoint_index "${index[@]}"
# An index whose weight map names the shard the target writes beside it.
printf '{"metadata": {}, "weight_map": {"x": "a.safetensors", "y": "a.safetensors"}}' >"$corpus/checkpoint_index/beside"
seed npy "${npy[@]}"
seed text_graph "${text[@]}"
seed json_graph "${json[@]}"
mkdir -p "$corpus/artifact"
for g in testdata/mlp/graph.json testdata/regress/params-only.txt testdata/regress/unary-on-param.txt; do
    "$MESHC" compile "$g" -o "$corpus/artifact/$(echo "$g" | tr / _).mshc"
done
"$MESHC" compile testdata/mlp/graph.json --layout testdata/mlp/layouts/dp-2.json -o "$corpus/artifact/mlp-dp-2.mshc"
# Over a symbolic batch: the symbols, the size table and how each step scales.
"$MESHC" compile testdata/mlp/graph.json --dim batch=1..64 -o "$corpus/artifact/mlp-batch.mshc"
for d in testdata/fuzz-regressions/*/; do
    [ -d "$d" ] && seed "$(basename "$d")" $(files "$d")
done
for t in "$corpus"/*/; do echo "$(basename "$t"): $(ls "$t" | wc -l) seeds"; done
