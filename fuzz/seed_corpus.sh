#!/usr/bin/env bash
# Fills fuzz/corpus/{config,safetensors}/ with the seeds from tests/data: every config.json; each
# checkpoint's first KiB (its header, cut) and the whole files small enough to fuzz quickly (at most
# 256 KiB: none of the tiny checkpoints since they grew to shapes the GPU step takes; tests/fuzz_parsers.rs
# fuzzes them whole). libFuzzer adds what it finds to the same folders.
set -euo pipefail
cd "$(dirname "$0")"
data=../tests/data
mkdir -p corpus/config corpus/safetensors
for m in "$data"/*/; do
  m=$(basename "$m")
  # A model's folder has its config; others (tests/data/bench-report: bench records) are not seeds.
  [ -e "$data/$m/config.json" ] || continue
  cp "$data/$m/config.json" "corpus/config/$m.json"
  for f in "$data/$m"/model*.safetensors; do
    [ -e "$f" ] || continue
    head -c 1024 "$f" > "corpus/safetensors/$m-$(basename "$f" .safetensors)-head"
    if [ "$(stat -c %s "$f")" -le 262144 ]; then
      cp "$f" "corpus/safetensors/$m-$(basename "$f")"
    fi
  done
done
echo "seed corpus: $(ls corpus/config | wc -l) configs, $(ls corpus/safetensors | wc -l) safetensors inputs"
