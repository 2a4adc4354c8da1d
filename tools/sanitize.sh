#!/usr/bin/env bash
# tools/sanitize.sh: compute-sanitizer over every GPU test and one full decode step (issue #11
# item 3). Fails on any report.
#
# Runs on the GPU machine, from the repository root of a copy that holds .gpu/ as
# ../shared/tools/gpu-bundle lays it out (test binaries in .gpu/tests/, the workspace's binaries,
# longrun among them, in .gpu/bin/). Here (to build and bundle):
#   ../shared/tools/gpu-bundle --no-benches
# There (carry [".gpu"]):
#   bash tools/sanitize.sh --quick          # what fits one ~10-minute call, see below
#   bash tools/sanitize.sh gpu_moe gpu_gdn  # every tool over these binaries (names as in .gpu/tests)
#   bash tools/sanitize.sh --plan 540       # everything, split into calls of ~540 s each (prints it)
#
# What runs, in this order (each run is one process under one tool, logged whole):
#   1. the decode step: `.gpu/bin/longrun step-once --steps 20` (the tiny model, tests/data/tiny-step:
#      20 eager steps, then 20 graph replays, teacher-forced over the goldens' tokens; the tiny QSA
#      layer's top-k selects blocks from position 15) under initcheck, memcheck and racecheck
#      (SANITIZE_STEPS=1: the single step and replay);
#   2. memcheck (with the leak check) over every GPU test binary;
#   3. racecheck over every GPU test binary (--quick: only those whose names contain `gpu_step`,
#      the whole step's kernels; --racecheck PATS picks others).
# A GPU test binary is one that lists #[ignore]d tests (`<bin> --list --ignored`): in this
# workspace every ignored test is one that "needs a CUDA device". That is every tests/gpu_*.rs
# binary, bad_inputs, and the tools package's decode test (`tools--test--decode`: it runs the
# bundled decode binary, .gpu/bin/decode, which the tool follows with --target-processes all).
# Only those tests run (`--ignored --test-threads=1`: the CPU tests launch nothing a sanitizer
# could see); --all-tests runs the CPU tests too (`--include-ignored`).
#
# Left out by default: gpu_overlap's
# `an_overlapped_launch_starts_before_its_predecessor_ends_and_waits_for_its_writes` (and
# gpu_trace's `an_overlapped_launch_starts_before_its_predecessor_ends_in_the_trace`), which times
# a programmatic dependent launch and asserts that it starts before its predecessor ends; the
# tools run kernels one after another, so it cannot hold under any of them (its other test,
# `overlap_timeline`, runs). --with-timing runs it anyway.
#
# Grid barriers: sample_top_p and qsa_top_blocks_grid (gpu_sample, gpu_qsa, gpu_step, the step)
# wait for every block of their grid. They are `#[kernel(..., cooperative)]`: every launch is a
# cooperative one, which the driver starts with the whole grid resident or fails with an error
# (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) instead of a hang. With ordinary launches racecheck
# stalled at their first barrier (a block that never started).
#
# Options
#   --quick            racecheck only the step target and gpu_step (see 3.)
#   --tools LIST       comma-separated subset of memcheck,racecheck,initcheck (default: all three)
#   --racecheck PATS   comma-separated name fragments of the test binaries racecheck runs on, or
#                      `all` (default: all; with --quick: gpu_step)
#   --timeout S        the most one run may take (default 300; env SANITIZE_TIMEOUT); a run past it
#                      is killed and reported TIMED OUT, which fails the script
#   --budget S         start no run after S seconds in all and cut the last one there, reporting what
#                      did not run as SKIPPED (default 540, for 10-minute calls; 0: no budget; env
#                      SANITIZE_BUDGET)
#   --filter F         a test-name filter passed to every test binary
#   --skip F           skip tests whose names contain F (repeatable; passed as the harness's --skip)
#   --all-tests        run the CPU tests of the GPU test binaries too
#   --no-step          leave out the decode-step target
#   --no-pdl           FLASHNEXT_NO_PDL=1: every launch serialised (if a tool cannot follow
#                      programmatic dependent launches; say so in RELIABILITY.md)
#   --until T          start no run after the time T (seconds since the epoch) and cut the last
#                      one there: --budget counted from now, for several invocations in one call
#   --strict           racecheck warnings fail too (errors always do)
#   --with-timing      run gpu_overlap's timing test too (it fails under the tools, see above)
#   --list             print the runs it would make, and exit
#   --plan S           print every run of the selection (tools, --racecheck, PATTERNs) split into
#                      calls of at most ~S seconds each (S=540 for 10-minute calls), from the rough
#                      durations in durations() below (H200, RELIABILITY.md's runs), as the command
#                      lines to run in each call, and exit. Works without .gpu/ (from the table).
#   PATTERN...         only these binaries: a PATTERN equal to a binary's name (`main--test--gpu_qsa`)
#                      or to its test name (`gpu_qsa`) picks that binary alone; any other PATTERN
#                      picks every binary whose name contains it (`gpu_q`); `step-once` is the step
# Environment: SANITIZER (the compute-sanitizer executable; else PATH, then /usr/local/cuda/bin),
# SANITIZER_ARGS (more arguments for every run, e.g. "--report-api-errors no"), OUT (where logs and
# the summary go; default /tmp/out).
#
# Output: $OUT/sanitize/<binary>.<tool>.log for each run (the test output and the tool's report),
# $OUT/sanitize-summary.txt (per binary per tool: OK / N errors / TIMED OUT / test failed / SKIPPED)
# and the same on stdout. Exit status: 0 every run clean; 1 a report, a failed test or a timeout;
# 2 clean but incomplete (runs skipped for the budget); 3 nothing could run (no sanitizer, no .gpu/).
#
# Runtime: a sanitizer slows kernels 10-100x (racecheck the most: it tracks every shared-memory
# access, and almost every kernel here stages through shared memory), and instruments each module
# as it loads; NVRTC compiles run at their normal speed (the kernel cache in
# ~/.cache/flashnext/kernels, or FLASHNEXT_CACHE_DIR, helps a second run on a warm machine). Split
# the work across calls with PATTERNs when one call cannot hold it: --plan S does the split, --list
# shows the runs of one invocation.
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

orig_args="$*"
quick=0; tools_csv="memcheck,racecheck,initcheck"; race_pats=""; timeout_s=${SANITIZE_TIMEOUT:-300}
budget_s=${SANITIZE_BUDGET:-540}; filter=""; skips=(); all_tests=0; with_step=1; strict=0; list=0
with_timing=0; plan_s=0; until_t=0
patterns=()
passthrough=() # the options a --plan's command lines carry over
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1; shift;;
    --tools) tools_csv="$2"; shift 2;;
    --racecheck) race_pats="$2"; shift 2;;
    --timeout) timeout_s="$2"; shift 2;;
    --budget) budget_s="$2"; shift 2;;
    --until) until_t="$2"; shift 2;;
    --filter) filter="$2"; passthrough+=("$1" "$2"); shift 2;;
    --skip) skips+=(--skip "$2"); passthrough+=("$1" "$2"); shift 2;;
    --all-tests) all_tests=1; passthrough+=("$1"); shift;;
    --no-step) with_step=0; shift;;
    --no-pdl) export FLASHNEXT_NO_PDL=1; passthrough+=("$1"); shift;;
    --strict) strict=1; passthrough+=("$1"); shift;;
    --with-timing) with_timing=1; passthrough+=("$1"); shift;;
    --list) list=1; shift;;
    --plan) plan_s="$2"; shift 2;;
    -h|--help) usage; exit 0;;
    -*) echo "sanitize.sh: unknown option $1 (--help lists them)" >&2; exit 3;;
    *) patterns+=("$1"); shift;;
  esac
done
for t in ${tools_csv//,/ }; do
  case "$t" in memcheck|racecheck|initcheck) ;; *) echo "sanitize.sh: --tools: unknown tool $t" >&2; exit 3;; esac
done
for v in "$timeout_s" "$budget_s" "$until_t" "$plan_s"; do
  [[ "$v" =~ ^[0-9]+$ ]] || { echo "sanitize.sh: $v is not a number of seconds" >&2; exit 3; }
done
if [ "$until_t" -gt 0 ]; then
  budget_s=$(( until_t - $(date +%s) )); [ "$budget_s" -lt 1 ] && budget_s=1
fi
[ -z "$race_pats" ] && { [ $quick = 1 ] && race_pats="gpu_step" || race_pats="all"; }
has_tool() { [[ ",$tools_csv," == *",$1,"* ]]; }

# Rough seconds per run on the NVIDIA H200 (compute-sanitizer 2025.3.1, driver 580, the kernel
# cache warm), by test binary: memcheck, racecheck, initcheck ("-": that tool does not run there).
# Measured in RELIABILITY.md's runs (2026-11-30) except where the comment says "guess"; "sum" is
# the sum of one-test-group runs made four or five at once on one GPU (08:04 and 08:14 UTC; and
# session 18's of 10:45-11:32 UTC, up to nine at once), an upper bound of one run alone. --plan packs calls with these; a binary above a call's length
# (gpu_gdn, gpu_step under racecheck) needs --filter to split it, as RELIABILITY.md's runs did.
durations() {
  cat <<'TABLE'
step-once       5    14    2
bad_inputs      6    15    -
gpu_embed       2     3    -
gpu_fill        2    50    -
gpu_lm_head    34    82    -
gpu_mix        10    17    -
gpu_overlap     1     1    -
gpu_ple        63    90    -    session 18, beside eight other runs
gpu_qsa        14   350    -    racecheck: 96 + 28 s for two groups of three tests, 224 s for the graph-replay test
gpu_qsa_layer  23    90    -    racecheck a guess
gpu_synthetic   1    10    -    racecheck a guess
gpu_sample      5   650    -    racecheck: 179 s the published vocabulary; the tile sweep alone ran past 447 s (cut in sessions 21 and 22), more than a call
gpu_step      900  2260    -    sum (memcheck: three golden tests cut at 545 s, the fourth 236 s)
gpu_gdn       370  1010    -    sums of one-test runs (session 18: the NVFP4 sweep of 42 input projection sets 162 / 282 s)
gpu_gemv_nvfp4 25    31    -    session 18
gpu_moe        95   165    -    racecheck a sum
gpu_helpers     2    10    -    racecheck a guess
gpu_kernels    21    80    -    racecheck a guess
decode          5   170    -    racecheck (tools--test--decode)
TABLE
}
unknown_s=(60 240 60) # a binary the table lacks: memcheck, racecheck, initcheck
duration_of() { # $1 = test name, $2 = tool
  local col=2 d
  case "$2" in racecheck) col=3;; initcheck) col=4;; esac
  d=$(durations | awk -v n="$1" -v c="$col" '$1 == n { print $c }')
  if [[ "$d" =~ ^[0-9]+$ ]]; then echo "$d"; else echo "${unknown_s[$((col - 2))]}"; fi
}

OUT=${OUT:-/tmp/out}
summary="$OUT/sanitize-summary.txt"

if [ ! -d .gpu/tests ] && [ "$plan_s" = 0 ]; then
  echo "sanitize.sh: no .gpu/tests here: run ../shared/tools/gpu-bundle where the code is built, carry .gpu," \
       "and run this from the repository root of the copy" >&2
  exit 3
fi

sanitizer=${SANITIZER:-}
if [ -z "$sanitizer" ]; then
  sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
  if [ -z "$sanitizer" ]; then
    for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
             /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
      [ -x "$c" ] && sanitizer="$c"
    done
  fi
fi
if [ $list = 0 ] && [ "$plan_s" = 0 ] && { [ -z "$sanitizer" ] || [ ! -x "$sanitizer" ]; }; then
  echo "sanitize.sh: compute-sanitizer not found (PATH, /usr/local/cuda*/bin); set SANITIZER=/path/to/it" >&2
  exit 3
fi

# The tests find tests/data through their compile-time checkout path: link it to this copy, as
# .gpu/run.sh does.
root=$(sed -n 's/^if \[ ! -e "\(.*\)" \]; then mkdir.*/\1/p' .gpu/run.sh 2>/dev/null | head -1)
if [ -n "$root" ] && [ ! -e "$root" ]; then
  mkdir -p "$(dirname "$root")" && ln -s "$(pwd)" "$root"
fi

# A test that runs a workspace binary finds it at its build path (env!("CARGO_BIN_EXE_<name>"),
# target/release/<name>): point that at the bundled one.
for b in .gpu/bin/*; do
  [ -x "$b" ] || continue
  [ -e "target/release/$(basename "$b")" ] && continue
  mkdir -p target/release && ln -s "../../$b" "target/release/$(basename "$b")"
done

# A binary's test name: `gpu_qsa` for `main--test--gpu_qsa`, `decode` for `tools--test--decode`.
short_of() { local n=${1##*/}; echo "${n##*--}"; }

# Every name a PATTERN can equal: a PATTERN equal to one picks that target alone, any other picks
# every target whose name contains it.
exact=" step-once "
if [ -d .gpu/tests ]; then
  for t in .gpu/tests/*; do [ -f "$t" ] && exact+="$(basename "$t") $(short_of "$t") "; done
else
  exact+="$(durations | awk '{ printf "%s ", $1 }')"
fi
picks() { # $1 = a target's name; the rest: the PATTERNs (none: everything)
  local full=$1 short; short=$(short_of "$1"); shift
  [ $# -eq 0 ] && return 0
  local p; for p in "$@"; do
    { [ "$p" = "$full" ] || [ "$p" = "$short" ]; } && return 0
    [[ "$exact" == *" $p "* ]] && continue
    [[ "$full" == *"$p"* ]] && return 0
  done
  return 1
}
wanted() { picks "$1" "${patterns[@]}"; } # $1 = a target's name: whether the PATTERNs select it
race_wanted() {
  [ "$race_pats" = all ] && return 0
  # shellcheck disable=SC2086
  picks "$1" ${race_pats//,/ }
}

# The GPU test binaries (without .gpu/, for --plan: the table's names).
gpu_bins=()
if [ -d .gpu/tests ]; then
  for t in .gpu/tests/*; do
    if [ ! -x "$t" ] || [ ! -f "$t" ]; then continue; fi
    n=$(basename "$t")
    wanted "$n" || continue
    # The listing is read whole before it is searched: `| grep -q` would stop reading at the first
    # match, and under pipefail the binary's SIGPIPE then dropped it (gpu_qsa_layer, session 19).
    listing=$("$t" --list --ignored 2>/dev/null) || continue
    grep -q ': test$' <<< "$listing" || continue
    # The decode test runs the decode binary (target/release/decode, linked to the bundled one).
    if [ "$(short_of "$n")" = decode ] && [ ! -x .gpu/bin/decode ] && [ "$plan_s" = 0 ]; then
      echo "sanitize.sh: .gpu/bin/decode is missing (gpu-bundle without --no-bins builds it): $n is left out" >&2
      continue
    fi
    gpu_bins+=("$t")
  done
else
  while read -r n _; do
    [ "$n" = step-once ] && continue
    wanted "$n" && gpu_bins+=("$n")
  done < <(durations)
fi
step_bin=.gpu/bin/longrun
step_ok=0
if [ $with_step = 1 ] && wanted step-once; then
  if [ -x "$step_bin" ] || [ "$plan_s" != 0 ]; then step_ok=1
  else echo "sanitize.sh: $step_bin is missing (gpu-bundle without --no-bins builds it): the step target is left out" >&2
  fi
fi

# The plan: lines of "tool<TAB>path".
plan=()
if [ $step_ok = 1 ]; then
  for tool in initcheck memcheck racecheck; do has_tool $tool && plan+=("$tool	$step_bin"); done
fi
if has_tool memcheck; then for t in "${gpu_bins[@]}"; do plan+=("memcheck	$t"); done; fi
if has_tool racecheck; then
  for t in "${gpu_bins[@]}"; do race_wanted "$(basename "$t")" && plan+=("racecheck	$t"); done
fi
if [ ${#plan[@]} -eq 0 ]; then
  echo "sanitize.sh: nothing to run (no GPU test binary or step target selected)" >&2
  exit 3
fi

test_args=(--test-threads=1)
[ $all_tests = 1 ] && test_args=(--include-ignored "${test_args[@]}") || test_args=(--ignored "${test_args[@]}")
[ -n "$filter" ] && test_args+=("$filter")
test_args+=("${skips[@]}")
# gpu_overlap's and gpu_trace's timing tests (this prefix names both) cannot hold under a tool
# that runs kernels one after another.
timing_test=an_overlapped_launch_starts_before_its_predecessor_ends

name_of() { if [ "$1" = "$step_bin" ]; then echo step-once; else basename "$1"; fi; }
step_args=(step-once --steps "${SANITIZE_STEPS:-20}")
run_args_of() { # $1 = a target: sets run_args
  if [ "$1" = "$step_bin" ]; then run_args=("${step_args[@]}"); return; fi
  run_args=("${test_args[@]}")
  case "$(short_of "$1")" in
    gpu_overlap | gpu_trace) if [ $with_timing = 0 ]; then run_args+=(--skip "$timing_test"); fi ;;
  esac
}
args_of() { run_args_of "$1"; echo "${run_args[*]}"; }

if [ "$plan_s" != 0 ]; then
  # Calls of at most plan_s seconds with a margin of 15% for the estimates: first fit, longest
  # first. A call's runs go into one invocation per tool (and one for the step); each invocation
  # gets the call's end (--until) so that a slow run leaves the later ones SKIPPED, not the call
  # killed.
  cap=$(( plan_s * 85 / 100 ))
  items=$(for p in "${plan[@]}"; do
    tool=${p%%	*}; bin=${p#*	}; n=$(short_of "$(name_of "$bin")")
    echo "$(duration_of "$n" "$tool") $tool $n"
  done | sort -k1,1nr -k3,3)
  calls=() # "seconds|tool name tool name ..."
  while read -r secs tool n; do
    [ -z "$secs" ] && continue
    placed=0
    for i in "${!calls[@]}"; do
      used=${calls[$i]%%|*}
      if [ $(( used + secs )) -le "$cap" ]; then
        calls[i]="$(( used + secs ))|${calls[$i]#*|} $tool $n"; placed=1; break
      fi
    done
    [ $placed = 0 ] && calls+=("$secs| $tool $n")
  done <<< "$items"
  extra=""; [ ${#passthrough[@]} -gt 0 ] && extra=" ${passthrough[*]}"
  echo "# tools/sanitize.sh --plan $plan_s: ${#plan[@]} runs in ${#calls[@]} call(s) of at most ~$plan_s s" \
       "(estimates: durations() in the script, H200; packed to $cap s)"
  echo "# Each call: send .gpu (carry [\".gpu\"]) and run its lines from the copy's root; the summaries land"
  echo "# in \$OUT/cN-<tool>/sanitize-summary.txt."
  k=0
  for c in "${calls[@]}"; do
    k=$((k + 1)); secs=${c%%|*}; read -r -a runs <<< "${c#*|}"
    echo
    note=""; [ "$secs" -gt "$cap" ] && note=" (one run over the call: split it with --filter, or run it alone with a longer --timeout)"
    echo "# call $k: ~$secs s$note"
    echo "e=\$(( \$(date +%s) + $plan_s ))"
    step_tools=""; mem=""; race=""
    for ((j = 0; j < ${#runs[@]}; j += 2)); do
      tool=${runs[j]}; n=${runs[j + 1]}
      if [ "$n" = step-once ]; then step_tools+="${step_tools:+,}$tool"
      elif [ "$tool" = memcheck ]; then mem+=" $n"
      else race+=" $n"; fi
    done
    [ -n "$step_tools" ] && echo "OUT=\${OUT:-/tmp/out}/c$k-step bash tools/sanitize.sh --tools $step_tools --until \$e --timeout $plan_s$extra step-once"
    [ -n "$mem" ] && echo "OUT=\${OUT:-/tmp/out}/c$k-memcheck bash tools/sanitize.sh --tools memcheck --no-step --until \$e --timeout $plan_s$extra$mem"
    [ -n "$race" ] && echo "OUT=\${OUT:-/tmp/out}/c$k-racecheck bash tools/sanitize.sh --tools racecheck --no-step --until \$e --timeout $plan_s$extra$race"
  done
  exit 0
fi
mkdir -p "$OUT/sanitize"

if [ $list = 1 ]; then
  echo "sanitizer: ${sanitizer:-<not found>}; per run timeout ${timeout_s} s; budget ${budget_s} s"
  for p in "${plan[@]}"; do
    tool=${p%%	*}; bin=${p#*	}
    echo "  $tool  $bin $(args_of "$bin")"
  done
  exit 0
fi

tool_args() { # $1 = tool
  case "$1" in
    memcheck) echo "--tool memcheck --leak-check full";;
    racecheck) echo "--tool racecheck";;
    initcheck) echo "--tool initcheck";;
  esac
}

overlap_note=""; [ $with_timing = 0 ] && overlap_note=" (gpu_overlap, gpu_trace: also --skip $timing_test)"
{
  echo "compute-sanitizer over the GPU tests and one decode step (tools/sanitize.sh)"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "sanitizer: $sanitizer ($("$sanitizer" --version 2>/dev/null | grep -iE 'version' | head -1))"
  echo "arguments: ${orig_args:-(none)}; tools $tools_csv, racecheck on: $race_pats; timeout ${timeout_s} s a run," \
       "budget ${budget_s} s; test arguments: ${test_args[*]}${overlap_note}${FLASHNEXT_NO_PDL:+; FLASHNEXT_NO_PDL=1}" \
       "${SANITIZER_ARGS:+; SANITIZER_ARGS=$SANITIZER_ARGS}"
  echo
  printf '%-40s %-10s %8s  %s\n' binary tool seconds result
} > "$summary"
cat "$summary"

start=$(date +%s)
fails=0; skipped=0; cut=0
for p in "${plan[@]}"; do
  tool=${p%%	*}; bin=${p#*	}; name=$(name_of "$bin")
  log="$OUT/sanitize/$name.$tool.log"
  limit=$timeout_s; budget_cut=0
  if [ "$budget_s" -gt 0 ]; then
    left=$(( budget_s - ($(date +%s) - start) ))
    if [ $left -lt 30 ]; then
      printf '%-40s %-10s %8s  %s\n' "$name" "$tool" - "SKIPPED (budget of ${budget_s} s spent)" | tee -a "$summary"
      skipped=$((skipped + 1)); continue
    fi
    [ $left -lt "$limit" ] && { limit=$left; budget_cut=1; }
  fi
  run_args_of "$bin"
  read -r -a tool_words <<< "$(tool_args "$tool")"
  read -r -a extra_words <<< "${SANITIZER_ARGS:-}"
  cmd=("$sanitizer" "${tool_words[@]}" --error-exitcode 1 --print-limit 50 --target-processes all
       "${extra_words[@]}" "$bin" "${run_args[@]}")
  echo "\$ ${cmd[*]}" > "$log"
  t0=$(date +%s)
  timeout -k 30 "$limit" "${cmd[@]}" >> "$log" 2>&1; rc=$?
  secs=$(( $(date +%s) - t0 ))

  # Every process's summary (a test may start others: --target-processes all follows them).
  errors=$(grep -aoE 'ERROR SUMMARY: [0-9]+ errors?' "$log" | awk '{s += $3} END {print s + 0}')
  summaries=$(grep -acE 'ERROR SUMMARY: [0-9]+' "$log")
  race=$(grep -aoE 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)' "$log")
  race_errors=$(echo "$race" | grep -oE '\([0-9]+ error' | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}')
  race_warnings=$(echo "$race" | grep -oE '[0-9]+ warnings?' | awk '{s += $1} END {print s + 0}')
  [ "$race_errors" -gt "$errors" ] && errors=$race_errors
  [ -n "$race" ] && summaries=$((summaries + 1))
  first=$(grep -a '^========= [A-Za-z]' "$log" | grep -avE 'COMPUTE-SANITIZER|SUMMARY|^========= +(at|by|Host|Device|Saved) ' \
          | head -1 | sed 's/^========= //' | cut -c1-140)
  tests=$(grep -aE '^test result:' "$log" | tail -1 | sed -E 's/^test result: //; s/; finished in.*//')

  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    if [ $budget_cut = 1 ]; then result="CUT at the budget after ${secs} s (incomplete)"; cut=$((cut + 1))
    else result="TIMED OUT after ${secs} s"; fails=$((fails + 1)); fi
    [ "$errors" -gt 0 ] && { result="$result, $errors errors before it: $first"; fails=$((fails + 1)); }
  elif [ "$errors" -gt 0 ]; then
    result="$errors errors: $first"; fails=$((fails + 1))
  elif [ $rc -ne 0 ]; then
    result="test failed (rc=$rc)${tests:+: $tests}"; fails=$((fails + 1))
  elif [ "$summaries" -eq 0 ]; then
    result="NO SANITIZER SUMMARY in the log (did the tool attach?)"; fails=$((fails + 1))
  elif [ "$race_warnings" -gt 0 ] && [ $strict = 1 ]; then
    result="$race_warnings racecheck warnings (--strict)"; fails=$((fails + 1))
  else
    result="OK${tests:+ ($tests)}"
    [ "$race_warnings" -gt 0 ] && result="$result, $race_warnings racecheck warnings"
  fi
  printf '%-40s %-10s %8s  %s\n' "$name" "$tool" "$secs" "$result" | tee -a "$summary"
done

total=$(( $(date +%s) - start ))
{
  echo
  if [ $fails -gt 0 ]; then echo "FAILED: $fails of ${#plan[@]} runs reported or failed (logs: $OUT/sanitize/), ${total} s"
  elif [ $((skipped + cut)) -gt 0 ]; then echo "INCOMPLETE: clean so far, $skipped runs skipped and $cut cut at the budget, ${total} s"
  else echo "OK: ${#plan[@]} runs, no report, ${total} s"; fi
} | tee -a "$summary"
[ $fails -gt 0 ] && exit 1
[ $((skipped + cut)) -gt 0 ] && exit 2
exit 0
