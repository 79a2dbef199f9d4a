#!/bin/sh
# Remove from the engine venv what vLLM never loads at run time, and report the largest
# trees so the next candidate is chosen by measurement. Runs in the builder stage, so
# nothing removed here reaches a final-image layer. Each removal says why it is safe;
# docs/build-cuda.md has the sizes, and tests/cuda/test_image_proofs.py proves in the
# built image that every DT_NEEDED still resolves and every vllm/torch/triton module
# still imports. Anything a GPU code path of a text model might load (cuBLAS, cuFFT,
# NCCL, nvcc, FA2, torch's CUPTI, ...) stays.
set -eu
venv=$1
sp=$(ls -d "$venv"/lib/python3*/site-packages)
mb() { du -sm "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
step() { echo "strip-venv: $1: $(mb "$venv") MB"; }
step "installed"

# Debug sections (DWARF) and static symbol tables (.symtab/.strtab) only serve debuggers,
# profilers and crash symbolizers; the loader and dlsym use the dynamic symbol table,
# which stays, as do code and CUDA fatbins. libtriton.so alone carries ~290 MB of DWARF,
# torch's libraries ~180 MB of symbol tables. strip-symbols.py keeps a stripped file only
# if the loader maps exactly the same bytes from it (patchelf'd files included).
"$venv"/bin/python /usr/local/bin/strip-symbols.py "$venv"
step "debug sections and static symbol tables stripped"

# Kept on purpose: the ROCm backends' Python code of both Triton builds. Triton loads
# every backend named in its entry points; without them `import triton` fails and torch
# and vLLM silently run as if Triton were not installed.
# cuSOLVER-Mg (multi-GPU dense solvers) and the alternative-ABI NVRTC build: no library
# in the venv links them (torch links libcusolver / libnvrtc, never these).
rm -f "$sp"/nvidia/cu*/lib/libcusolverMg.so.* "$sp"/nvidia/cu*/lib/libnvrtc.alt.so.* \
      "$sp"/nvidia/cu*/lib/libnvrtc-builtins.alt.so.*
# CUTLASS DSL ships its runtime (cu*/lib) and its MLIR compiler module
# (_cutlass_ir.cu*.so, ~190 MB each) for CUDA 12 and 13; torch here is a CUDA 13 build.
# The DSL loads the newest flavour the driver supports, and a driver too old for 13
# cannot run this torch at all; without cu12/lib the cu12 module was unusable anyway.
# Both majors are read from files, not by importing: a cross-placed venv (aarch64 wheels
# on an x86-64 builder) cannot be imported here.
cuda_major=$(sed -n "s/^cuda: .* = '\([0-9]*\)\..*'$/\1/p" "$sp/torch/version.py")
[ -n "$cuda_major" ] || { echo "strip-venv: no CUDA version in $sp/torch/version.py" >&2; exit 1; }
for d in "$sp"/nvidia_cutlass_dsl/cu[0-9]*; do
  [ "$(basename "$d")" = "cu$cuda_major" ] || rm -rf "$d"
done
for f in "$sp"/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu[0-9]*.so; do
  case "$(basename "$f")" in _cutlass_ir.cu$cuda_major.*) ;; *) rm -f "$f" ;; esac
done
# nccl4py (NCCL's EP and M2N extensions) ships both majors too and picks the one of the
# installed cuda-bindings; refuse to guess if that is not torch's major.
bindings_major=$("$venv"/bin/python -c "import importlib.metadata as m; print(m.version('cuda-bindings').split('.')[0])")
[ "$bindings_major" = "$cuda_major" ] || { echo "strip-venv: cuda-bindings $bindings_major != torch CUDA $cuda_major" >&2; exit 1; }
for d in "$sp"/nccl/*/lib/cu[0-9]*; do
  [ "$(basename "$d")" = "cu$cuda_major" ] || rm -rf "$d"
done
step "cuSOLVER-Mg, NVRTC alt-ABI, CUTLASS DSL and nccl4py for other CUDA majors removed"

# cuDNN's causal-convolution sub-library (libcudnn_ext, ~128 MB): the shim libcudnn.so.9
# loads it only for the seven cudnn*CausalConv1d*/cudnnSubquadraticOpsVersionCheck
# entry points it defines. torch imports none of them (tests/cuda/proofs/removed_symbols.py
# checks every ELF file's imports against the plain image's libcudnn_ext); only
# cudnn-frontend's cudnn.ops.causal_conv1d calls them, and neither vLLM nor FlashInfer
# calls that (vLLM's causal conv1d is its own Triton kernel). The graph, engine,
# heuristic, ops, cnn and adv libraries all stay.
rm -f "$sp"/nvidia/cudnn/lib/libcudnn_ext.so.*
step "cuDNN's causal-conv1d sub-library removed"

# TileLang's copy of AMD's Composable Kernel headers (~44 MB): included only when
# TileLang compiles for a HIP target; its CUDA target uses the CUTLASS headers, which stay.
rm -rf "$sp"/tilelang/3rdparty/composable_kernel
# Test suites and examples shipped inside packages (numba, numpy, sympy, networkx, ...,
# CUTLASS's examples/ and test/ in FlashInfer's JIT sources): no code imports a package's
# tests/ at run time, and FlashInfer's JIT includes only cutlass/include and tools/.
# torch, vLLM and Triton keep theirs: the import proof walks every module of them.
find "$sp" -mindepth 2 -type d -name tests -prune \
     ! -path "$sp/torch/*" ! -path "$sp/vllm/*" ! -path "$sp/triton/*" ! -path "$sp/tokenspeed_triton/*" \
     -exec rm -rf {} +
rm -rf "$sp"/flashinfer/data/cutlass/examples "$sp"/flashinfer/data/cutlass/test
step "Composable Kernel headers, test suites and examples removed"

# Static archives of CUPTI and NVPerf that Triton ships to build Proton from source
# (~170 MB): only a linker reads a .a, and the only run-time link Triton does is its
# driver module against libcuda (-l:libcuda.so.1). Proton itself uses the shared copies,
# which stay. nvcc's own archives (libcudart_static.a, libcudadevrt.a) stay: nvcc links
# them by default.
rm -f "$sp"/triton/backends/nvidia/lib/cupti*/lib*_static.a \
      "$sp"/tokenspeed_triton/backends/nvidia/lib/cupti*/lib*_static.a
# tokenspeed-triton's AMD code generator (~96 MB): dlopened only by the HIP backend's
# compile path (_load_amd_codegen), which runs only for an AMD GPU target. The backend's
# Python stays, so its entry point still imports.
rm -f "$sp"/tokenspeed_triton/backends/amd/lib/libtriton_amd_codegen.so
# z3-solver's command-line solver (bin/z3, 17 MB): the Python bindings torch's symbolic
# shapes use load z3/lib/libz3.so through ctypes; no module in the venv runs the binary.
rm -f "$venv"/bin/z3
step "static CUPTI archives, the AMD code generator and the z3 CLI removed"

# Triton's own CUPTI copies (~85 MB): loaded only by Proton, Triton's profiler, when a
# profiling session starts; vLLM never starts one (torch's profiler uses nvidia/'s CUPTI).
rm -rf "$sp"/triton/backends/nvidia/lib/cupti "$sp"/triton/backends/nvidia/lib/cupti-blackwell
step "Proton's CUPTI removed"

# OpenCV (~150 MB) is not installed at all (the engine lock excludes it): vLLM imports
# cv2 only to decode video inputs (vllm.multimodal.video, its OpenCV video decoder,
# vllm.assets.video); like torchaudio, torchcodec and PyNvVideoCodec it serves video and
# audio inputs. mistral_common and transformers import it only behind their is-installed
# checks. (The import proof checks that only media modules lose an import by this.)

# Identical files (the same bytes shipped by several wheels: cutlass/cute headers in
# flashinfer, tilelang and vLLM's third_party trees, three names of one libcupti, ...)
# become hard links to one copy. Nothing changes for a reader; the tree is root-owned
# and the server runs as uid 1000, so no process can write through one name to another.
"$venv"/bin/python - "$venv" <<'EOF'
import hashlib, os, sys
seen, saved = {}, 0
for root, _, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(root, name)
        st = os.lstat(path)
        if not os.path.isfile(path) or os.path.islink(path) or st.st_size < 4096 or st.st_nlink > 1:
            continue
        with open(path, "rb") as f:
            key = (st.st_size, st.st_mode, hashlib.sha256(f.read()).digest())
        first = seen.setdefault(key, path)
        if first != path:
            os.unlink(path)
            os.link(first, path)
            saved += st.st_size
print(f"strip-venv: {saved / 1e6:.0f} MB of duplicate files hard-linked")
EOF
step "duplicates hard-linked"

echo "strip-venv: largest packages now:"
du -sm "$sp"/* | sort -rn | head -15
