#!/bin/sh
# Trim the runtime OS of engine-cuda (runs in the rootfs stage, after apt-get install).
# Everything removed here is measured and explained in docs/build-cuda.md; what the
# kept compilers need is proved by tests/cuda/proofs/compilers.py in the built image.
# Paths name the image's own multiarch triplet (x86_64-linux-gnu, aarch64-linux-gnu):
# with x86-64 paths written out, the arm64 image kept 58 MB of what is removed below.
set -eu
mb() { du -sm "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }
before=$(mb /usr /var)
triplet=$(gcc -dumpmachine)  # gcc is installed in this stage: x86_64-linux-gnu, aarch64-linux-gnu
[ -d "/usr/lib/$triplet" ] || { echo "trim-rootfs: no /usr/lib/$triplet" >&2; exit 1; }

# apt's downloaded .debs, package lists and logs: apt is not run in the final image.
apt-get clean
rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/debconf/*-old \
       /usr/share/doc /usr/share/man /usr/share/info

# Message catalogs (/usr/share/locale/*/LC_MESSAGES/*.mo, 47 MB on arm64: coreutils,
# bash, dpkg, binutils, ...): gettext reads one only under a non-C locale, and this image
# has none but C and C.UTF-8 (LANG=C.UTF-8; no `locales` package, nothing generated), so
# every program already prints its English messages. locale.alias stays.
find /usr/share/locale -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +

# The link-time optimizer (lto1, lto-dump): only `-flto` builds run it, and none of the
# run-time compiles does (Triton: -O3 -shared -fPIC; torch cpp_extension; nvcc's host
# pass). The linker plugin liblto_plugin.so stays: gcc hands it to ld on every link.
rm -f /usr/lib/gcc/"$triplet"/*/lto1 /usr/bin/*lto-dump*

# Sanitizer runtimes (ASan, TSan, LSan, UBSan, HWASan): linked only with -fsanitize=.
rm -f /usr/lib/"$triplet"/lib*san.so* /usr/lib/gcc/"$triplet"/*/lib*san*.a \
      /usr/lib/gcc/"$triplet"/*/lib*san*.so /usr/lib/gcc/"$triplet"/*/lib*san_preinit.o

# libpython's static archives: extensions (Triton's driver module, cpp_extension) are
# shared objects that never link libpython; they need only its headers.
rm -f /usr/lib/python3*/config-3*/libpython3*.a /usr/lib/"$triplet"/libpython3*.a

echo "trim-rootfs: /usr + /var $before -> $(mb /usr /var) MB"
