#!/usr/bin/env bash
# gpu-pack: a device call's executables, small enough to carry. A call carries the working tree
# and what it names under 64 MiB; the tree is ~42 MB and the whole workspace's executables
# (../shared/tools/gpu-bundle) ~280 MB, so a call takes the few it runs: built here in release,
# stripped and xz-compressed into .gpu-pack/pack.tar.xz (six test and bench binaries: ~4 MB), with
# .gpu-pack/pack.sh, which unpacks them on the device and links this checkout's path to the copy
# there (the tests find tests/data through their compile-time path).
#
# usage: tools/gpu-pack.sh [--test NAME]... [--bench NAME]... [--bin NAME]... [--file PATH]...
#   --test gpu_gdn     a test target of the root package (tests/gpu_gdn.rs)
#   --bench step       a bench target of the root package (benches/step.rs)
#   --bin autotune     a binary of the workspace (tools/src/bin/autotune.rs)
#   --all-benches      every bench target of the root package (for tools/bench-smoke.sh)
#   --file PATH        any file to unpack beside them (a pinned table, say)
#   --base REV         each --bench also built at REV (a commit, main say), packed as NAME-base, so
#                      that one call times a change against its base, interleaved in one run script
#                      (REV is checked out in a git worktree beside the target dir, which it shares;
#                      a bench that reads files of the checkout reads this tree's on the device)
#   --into NAME        pack into .gpu-pack/NAME/ (unpacked there into /tmp/flashnext-pack-NAME),
#                      leaving the other packs under .gpu-pack alone: so that two branches, packed
#                      one after the other, travel in one call (`bash .gpu-pack/NAME/pack.sh`)
# then: device call with carry [".gpu-pack"] and the command `bash .gpu-pack/pack.sh && /tmp/flashnext-pack/gpu_gdn
# --include-ignored --test-threads=1` (each executable under its target's name). A call brings
# back at most 8 files from $OUT: a traced step (`FLASHNEXT_TRACE=1`, five files of stamps) goes
# into one tar there, or its files are left behind.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
tests=(); benches=(); bins=(); files=(); base=""; into=""
while [ $# -gt 0 ]; do
  case "$1" in
    --test) tests+=("$2"); shift 2;;
    --bench) benches+=("$2"); shift 2;;
    --bin) bins+=("$2"); shift 2;;
    --file) files+=("$2"); shift 2;;
    --base) base="$2"; shift 2;;
    --into) into="$2"; shift 2;;
    --all-benches)
      mapfile -t -O "${#benches[@]}" benches < <(tools/bench-smoke.sh --list)
      shift;;
    -h|--help) sed -n 2,21p "$0"; exit 0;;
    *) echo "gpu-pack: unknown argument $1 (--help says what it takes)" >&2; exit 2;;
  esac
done
if [ $(( ${#tests[@]} + ${#benches[@]} + ${#bins[@]} )) -eq 0 ]; then
  echo "gpu-pack: name at least one --test, --bench or --bin" >&2; exit 2
fi
for f in "${files[@]}"; do [ -f "$f" ] || { echo "gpu-pack: --file $f: no such file" >&2; exit 2; }; done
if [ -n "$into" ] && ! [[ "$into" =~ ^[A-Za-z0-9][A-Za-z0-9_-]*$ ]]; then
  echo "gpu-pack: --into $into: a plain name (letters, digits, - and _), not a path" >&2; exit 2
fi
if [ -n "$base" ]; then
  [ ${#benches[@]} -gt 0 ] || { echo "gpu-pack: --base needs at least one --bench" >&2; exit 2; }
  git rev-parse --verify --quiet "$base^{commit}" > /dev/null \
    || { echo "gpu-pack: --base $base: not a commit here" >&2; exit 2; }
fi

stage=$(mktemp -d)
base_tree=""
cleanup() {
  [ -z "$base_tree" ] || git worktree remove --force "$base_tree" 2> /dev/null || true
  rm -rf "$stage"
}
trap cleanup EXIT
# Copies each executable cargo reports (JSON messages on stdin) to $stage under its target's name
# and the suffix given (none, or -base).
collect() {
  python3 -c '
import json, shutil, sys, os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-message" and m["message"].get("level") == "error":
        sys.stderr.write(m["message"].get("rendered", ""))
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe:
        out = os.path.join(sys.argv[1], m["target"]["name"] + sys.argv[2])
        shutil.copy2(exe, out)
        print(out)
' "$stage" "${1:-}"
}
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
[ ${#tests[@]} -eq 0 ] || cargo test -p flashnext --release --no-run --message-format=json "${args[@]}" | collect
args=()
for b in "${benches[@]}"; do args+=(--bench "$b"); done
[ ${#benches[@]} -eq 0 ] || cargo bench -p flashnext --no-run --message-format=json "${args[@]}" | collect
args=()
for b in "${bins[@]}"; do args+=(--bin "$b"); done
[ ${#bins[@]} -eq 0 ] || cargo build --workspace --release --message-format=json "${args[@]}" | collect
based=()
if [ -n "$base" ]; then
  # The base's benches from a worktree of REV, into the same target dir: its dependencies are
  # built already, and its own crates get their own artifacts (another source path).
  base_tree="$stage/base-tree"
  git worktree add --detach --quiet "$base_tree" "$base"
  args=()
  for b in "${benches[@]}"; do args+=(--bench "$b"); based+=("$b-base"); done
  (cd "$base_tree" && CARGO_TARGET_DIR="$root/target" cargo bench -p flashnext --no-run --message-format=json "${args[@]}") \
    | collect -base
  git worktree remove --force "$base_tree" && base_tree=""
  echo "gpu-pack: the -base benches are $(git rev-parse --short "$base") ($base)" >&2
fi
for n in "${tests[@]}" "${benches[@]}" "${bins[@]}" "${based[@]}"; do
  [ -x "$stage/$n" ] || { echo "gpu-pack: cargo built no executable named $n" >&2; exit 1; }
  strip "$stage/$n"
done
for f in "${files[@]}"; do cp "$f" "$stage/"; done

# Each pack replaces only its own files: the named packs beside it stay, in either order (and
# travel: the size below counts all of .gpu-pack).
if [ -z "$into" ]; then
  dest=.gpu-pack; unpack=/tmp/flashnext-pack
  rm -f .gpu-pack/pack.tar.xz .gpu-pack/pack.sh
else
  dest=.gpu-pack/$into; unpack=/tmp/flashnext-pack-$into
  rm -rf "$dest"
fi
mkdir -p "$dest"
tar -C "$stage" -cJf "$dest/pack.tar.xz" .
cat > "$dest/pack.sh" <<RUN
#!/usr/bin/env bash
# Generated by tools/gpu-pack.sh: unpacks the executables into $unpack and makes the
# compile-time checkout path ($root) lead to this copy.
set -eu
here=\$(pwd)
if [ ! -e "$root" ]; then mkdir -p "\$(dirname "$root")" && ln -s "\$here" "$root"; fi
mkdir -p $unpack && tar -C $unpack -xJf $dest/pack.tar.xz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "\${OUT:-/tmp}/device.txt" 2>&1 || true
ls $unpack
RUN
tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
pack_bytes=$(du -cb .gpu-pack | tail -1 | cut -f1)
echo "gpu-pack: $dest/pack.tar.xz holds $(tar -tJf "$dest/pack.tar.xz" | grep -v '/$' | sed 's#^\./##' | tr '\n' ' ')" >&2
echo "gpu-pack: $(( (tree_bytes + pack_bytes) / 1048576 )) MiB to send of 64 (tree $(( tree_bytes / 1048576 )), pack $(( pack_bytes / 1048576 )))" >&2
