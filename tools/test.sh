#!/usr/bin/env bash
# The test command. Works on a fresh machine without a GPU or CUDA: when no NVRTC is found it
# installs NVIDIA's nvidia-cuda-nvrtc wheel (13.0) into .nvrtc/ in the project (pip, no root),
# and, without cuobjdump, its cuobjdump and nvdisasm wheels into .nvrtc-tools/, then runs every
# test of the workspace. GPU-only tests are #[ignore]d and listed as such.
set -euo pipefail
cd "$(dirname "$0")/.."

have_nvrtc() {
  local d
  for d in "${FLASHNEXT_NVRTC_DIR:-}" .nvrtc/nvidia/cu13/lib "${CUDA_PATH:-/nonexistent}/lib64" /usr/local/cuda/lib64; do
    [ -n "$d" ] && ls "$d"/libnvrtc.so.13* >/dev/null 2>&1 && ls "$d"/libnvrtc-builtins.so.13* >/dev/null 2>&1 && return 0
  done
  return 1
}

if ! have_nvrtc; then
  echo "== NVRTC not found: installing nvidia-cuda-nvrtc 13.0 into .nvrtc/"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target .nvrtc "nvidia-cuda-nvrtc==13.0.*"
  have_nvrtc || { echo "error: the NVRTC wheel did not provide libnvrtc.so.13" >&2; exit 1; }
fi

# cuobjdump and nvdisasm, for kernel-inspect's SASS map and the test that counts the load rounds
# of the kernels after their wait (tools/tests/kernel_inspect.rs): NVIDIA's wheels into
# .nvrtc-tools/ (kernel-inspect looks there too) where no CUDA toolkit has them.
if ! command -v cuobjdump >/dev/null 2>&1 && [ ! -x "${CUDA_PATH:-/nonexistent}/bin/cuobjdump" ] \
  && [ ! -x /usr/local/cuda/bin/cuobjdump ] && [ ! -x .nvrtc-tools/nvidia/cu13/bin/cuobjdump ]; then
  echo "== cuobjdump not found: installing nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm 13.5 into .nvrtc-tools/"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target .nvrtc-tools \
    "nvidia-cuda-cuobjdump==13.5.*" "nvidia-cuda-nvdisasm==13.5.*"
  [ -x .nvrtc-tools/nvidia/cu13/bin/cuobjdump ] || { echo "error: the wheels did not provide cuobjdump" >&2; exit 1; }
fi

echo "== cargo test --workspace"
cargo test --workspace "$@"

echo "== NVRTC compile report (tests/nvrtc_compile.rs)"
cat target/nvrtc-compile-report.txt
