#!/bin/sh
# Remove from the engine venv what vLLM never loads at run time, and report the largest
# trees so the next candidate is chosen by measurement. Runs in the builder stage, so
# nothing removed here reaches a final-image layer. Each removal says why it is safe;
# anything a GPU code path might load (cuBLAS, cuFFT, cuDNN, nvcc, FA2, ...) stays.
set -eu
venv=$1
sp=$(ls -d "$venv"/lib/python3*/site-packages)
mb() { du -sm "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
before=$(mb "$venv")

# Debug sections (DWARF) only serve debuggers; code, symbols and CUDA fatbins stay.
# libtriton.so alone carries ~230 MB of them.
find "$venv" -name '*.so*' -type f | while read -r lib; do
  if readelf -S "$lib" 2>/dev/null | grep -q '\.debug_info'; then
    strip --strip-debug "$lib"
  fi
done
echo "strip-venv: debug sections: $before -> $(mb "$venv") MB"

# Kept on purpose: the ROCm backends of both Triton builds (~100 MB). Triton loads every
# backend named in its entry points; without them `import triton` fails and torch and
# vLLM silently run as if Triton were not installed.
# cuSOLVER-Mg (multi-GPU dense solvers) and the alternative-ABI NVRTC build: no library
# in the venv links them (torch links libcusolver / libnvrtc, never these).
rm -f "$sp"/nvidia/cu*/lib/libcusolverMg.so.* "$sp"/nvidia/cu*/lib/libnvrtc.alt.so.* \
      "$sp"/nvidia/cu*/lib/libnvrtc-builtins.alt.so.*
# CUTLASS DSL ships libraries for CUDA 12 and 13; torch here is a CUDA 13 build.
cuda_major=$("$venv"/bin/python -c "import torch; print(torch.version.cuda.split('.')[0])")
for d in "$sp"/nvidia_cutlass_dsl/cu[0-9]*; do
  [ "$(basename "$d")" = "cu$cuda_major" ] || rm -rf "$d"
done

echo "strip-venv: $before -> $(mb "$venv") MB; largest packages now:"
du -sm "$sp"/* | sort -rn | head -15
