#!/usr/bin/env bash
# bench-smoke: runs benches once on the GPU machine, records only (no tile sweeps, no criterion
# timing), and says which ended in failure: a bench that stops at its first launch after a change
# of defaults is otherwise found only when someone next needs its figures (benches/gdn.rs stopped
# so for three sessions). Run after `tools/gpu-pack.sh --all-benches` (or naming the benches) and
# `bash .gpu-pack/pack.sh`.
#
# usage: tools/bench-smoke.sh [NAME]...   (default: every [[bench]] of Cargo.toml)
#        tools/bench-smoke.sh --list      (those names, one a line; tools/gpu-pack.sh reads them)
#   OUT=DIR keeps the records (bench-<name>.jsonl) and each bench's output (bench-<name>.log)
# exit status: 0 when every bench named ran to its end, 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pack=${FLASHNEXT_PACK_DIR:-/tmp/flashnext-pack}
# Every [[bench]] target's name in the root package's Cargo.toml.
all_benches() {
  awk '/^\[\[bench\]\]/{b=1; next} b && /^name *=/{gsub(/[" ]/, "", $0); sub(/^name=/, "", $0); print; b=0}' "$root/Cargo.toml"
}
if [ "${1:-}" = --list ]; then all_benches; exit 0; fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  mapfile -t names < <(all_benches)
fi
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
failed=0
for b in "${names[@]}"; do
  exe="$pack/$b"
  if [ ! -x "$exe" ]; then
    echo "bench $b: not in $pack (pack it with tools/gpu-pack.sh --bench $b)"; failed=1; continue
  fi
  # A criterion filter that matches no timing keeps a bench to its records; the step bench's
  # argument names its variant instead (it refuses one it does not know): the NVFP4 step, one round;
  # memory_churn's names its allocator: the engine's.
  filter=records-only
  [ "$b" = step ] && filter=nvfp4
  [ "$b" = memory_churn ] && filter=async
  start=$SECONDS
  (cd "$root" && OUT="$out" FLASHNEXT_BENCH_NO_SWEEP=1 FLASHNEXT_STEP_ROUNDS="${FLASHNEXT_STEP_ROUNDS:-1}" \
    FLASHNEXT_CHURN_CYCLES="${FLASHNEXT_CHURN_CYCLES:-1}" \
    timeout "${FLASHNEXT_SMOKE_SECS:-180}" "$exe" --bench "$filter") \
    > "$out/bench-$b.log" 2>&1
  status=$?
  if [ $status -eq 0 ]; then
    echo "bench $b: ran ($(( SECONDS - start )) s, $(grep -c . "$out/bench-$b.jsonl" 2>/dev/null || echo 0) records)"
  else
    echo "bench $b: FAILED (status $status after $(( SECONDS - start )) s); the end of its output:"
    tail -5 "$out/bench-$b.log" | sed 's/^/  /'
    failed=1
  fi
done
exit $failed
