#!/bin/sh
# Trim the runtime OS of engine-cuda (runs in the rootfs stage, after apt-get install).
# Everything removed here is measured and explained in docs/build-cuda.md; what the
# kept compilers need is proved by tests/cuda/proofs/compilers.py in the built image.
set -eu
mb() { du -sm "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
before=$(mb /usr /var)

# apt's downloaded .debs, package lists and logs: apt is not run in the final image.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/debconf/*-old \
       /usr/share/doc /usr/share/man /usr/share/info

# The link-time optimizer (lto1, lto-dump): only `-flto` builds run it, and none of the
# run-time compiles does (Triton: -O3 -shared -fPIC; torch cpp_extension; nvcc's host
# pass). The linker plugin liblto_plugin.so stays: gcc hands it to ld on every link.
rm -f /usr/lib/gcc/x86_64-linux-gnu/*/lto1 /usr/bin/*lto-dump*

# Sanitizer runtimes (ASan, TSan, LSan, UBSan, HWASan): linked only with -fsanitize=.
rm -f /usr/lib/x86_64-linux-gnu/lib*san.so* /usr/lib/gcc/x86_64-linux-gnu/*/lib*san*.a \
      /usr/lib/gcc/x86_64-linux-gnu/*/lib*san*.so /usr/lib/gcc/x86_64-linux-gnu/*/lib*san_preinit.o

# libpython's static archives: extensions (Triton's driver module, cpp_extension) are
# shared objects that never link libpython; they need only its headers.
rm -f /usr/lib/python3*/config-3*/libpython3*.a /usr/lib/x86_64-linux-gnu/libpython3*.a

echo "trim-rootfs: /usr + /var $before -> $(mb /usr /var) MB"
