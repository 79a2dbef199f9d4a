#!/usr/bin/env bash
# One-time (idempotent) machine set-up for kiln on Debian/Ubuntu as root:
# system packages, a running Docker daemon, kiln + kiln-engine + the locked dev toolchain
# in .venv (requirements/dev.lock),
# and the air-gapped base image kiln/base:bookworm (not with --no-base).
# --arm64: also qemu emulation of linux/arm64 (only builds for that platform need it):
# qemu-user 10+ (bookworm-backports on bookworm), binfmt_misc mounted, qemu-aarch64 registered.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '==> %s\n' "$*"; }

no_base=0 arm64=0
for arg in "$@"; do
  case "$arg" in
    --no-base) no_base=1 ;;
    --arm64) arm64=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --no-base, --arm64)" >&2; exit 64 ;;
  esac
done

# emulation for linux/arm64 builds and containers on an x86-64 host, only when asked:
# it changes the kernel's binfmt_misc table for the whole machine. The emulator must be
# qemu-user 10 or newer: under bookworm's 7.2, importing torch's aarch64 build (2.14.0+cu130)
# segfaults and the emulated process never exits (docs/multiarch.md), so on bookworm it comes
# from bookworm-backports. Registered with the F flag: the kernel opens the interpreter now,
# so containers use it without a copy inside them.
QEMU_MIN_MAJOR=10
qemu_major() { { "$1" --version 2>/dev/null || true; } | sed -n 's/.*version \([0-9]*\)\..*/\1/p' | head -1; }

install_qemu_user() {
  local codename suite=()
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [[ $codename == bookworm ]]; then
    say "apt-get install -t bookworm-backports qemu-user qemu-user-binfmt (bookworm's 7.2 cannot run torch)"
    local mirror; mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/* *$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "${mirror:-http://deb.debian.org/debian}" >/etc/apt/sources.list.d/kiln-bookworm-backports.sources
    suite=(-t bookworm-backports)
  else
    say "apt-get install qemu-user qemu-user-binfmt"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${suite[@]}" qemu-user qemu-user-binfmt >/dev/null
}

# (re)register qemu-aarch64 from the package's binfmt.d entry; an older registration (for
# example bookworm's qemu-user-static 7.2) is removed first
register_qemu_aarch64() {
  local conf=/usr/lib/binfmt.d/qemu-aarch64.conf entry=/proc/sys/fs/binfmt_misc/qemu-aarch64
  [[ -e /proc/sys/fs/binfmt_misc/register ]] || { say "mount binfmt_misc"; mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; }
  [[ -r $conf ]] || { echo "setup.sh --arm64: $conf is missing (package qemu-user-binfmt)" >&2; exit 1; }
  local interp; interp=$(grep -v '^#' "$conf" | head -1 | awk -F: '{print $(NF-1)}')
  if [[ -e $entry ]] && ! grep -qx "interpreter $interp" "$entry"; then echo -1 >"$entry"; fi
  [[ -e $entry ]] || grep -v '^#' "$conf" | head -1 >/proc/sys/fs/binfmt_misc/register
}

setup_arm64() {
  [[ "$(uname -m)" == "aarch64" ]] && { say "arm64 host: no emulation needed"; return; }
  [[ $EUID -eq 0 ]] || { echo "setup.sh --arm64: needs root (apt-get, mount, binfmt_misc)" >&2; exit 77; }
  local major; major=$(qemu_major /usr/bin/qemu-aarch64)
  if [[ -z $major || $major -lt $QEMU_MIN_MAJOR || ! -e /usr/lib/binfmt.d/qemu-aarch64.conf ]]; then install_qemu_user; fi
  major=$(qemu_major /usr/bin/qemu-aarch64)
  [[ -n $major && $major -ge $QEMU_MIN_MAJOR ]] \
    || { echo "setup.sh --arm64: qemu-aarch64 is version ${major:-unknown}; $QEMU_MIN_MAJOR or newer is needed" >&2; exit 1; }
  register_qemu_aarch64
  grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
    || { echo "setup.sh --arm64: qemu-aarch64 is not enabled in binfmt_misc" >&2; exit 1; }
  say "linux/arm64 emulation: qemu $(/usr/bin/qemu-aarch64 --version | head -1 | awk '{print $3}'), $(grep -E '^(interpreter|flags)' /proc/sys/fs/binfmt_misc/qemu-aarch64 | tr '\n' ' ')"
}

# the dev and test toolchain: exactly requirements/dev.lock (hashes required) in .venv, a
# virtualenv this checkout owns, never the system Python; then kiln, kiln-engine and the test
# helpers editable, without build isolation (their build backend is in the lock)
PY=${PYTHON:-python3} VENV=.venv
make_venv() {
  "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || {
    echo "setup.sh: requirements/dev.lock is resolved for Python 3.11 and $PY is $("$PY" -V 2>&1); set PYTHON to a python3.11" >&2
    exit 65; }
  if ! [[ -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    say "virtualenv $VENV ($("$PY" -V))"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV" 2>/dev/null || {
      apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
      "$PY" -m venv "$VENV"; }
  fi
}

setup_toolchain() {
  local t0=$SECONDS py=$PY venv=$VENV find_links=() cert
  # uv, at the lock's own pin and hash, by the venv's pip (the one unlocked step: pip itself)
  local uv_pin; uv_pin=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements/dev.lock)
  if [[ "$("$venv/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "$uv_pin" ]]; then
    awk '/^uv==/{on=1; print; next} on && /^[[:space:]]/{print; next} {on=0}' requirements/dev.lock >"$venv/uv.req"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes --no-deps -r "$venv/uv.req"
  fi
  # the sources are pip's own configuration: its local find-links (torch's CPU wheel) and CA
  for link in ${PIP_FIND_LINKS:-$("$py" -m pip config get global.find-links 2>/dev/null || true)}; do
    [[ -d $link ]] && find_links+=(--find-links "$link")
  done
  cert=${PIP_CERT:-$("$py" -m pip config get global.cert 2>/dev/null || true)}
  [[ -n $cert && -z ${SSL_CERT_FILE:-} ]] && export SSL_CERT_FILE=$cert
  say "uv pip sync requirements/dev.lock ($(grep -c '^[a-z0-9].*==' requirements/dev.lock) pins, hashes required)"
  # --compile-bytecode, and compileall for kiln's own editable sources: with
  # PYTHONDONTWRITEBYTECODE=1 (common in containers, set on this project's CI machines)
  # Python never caches bytecode itself, and uv writes none by default, so every `kiln`
  # start compiled docker, pydantic, rich and kiln from source: 1.0 s of CPU for `kiln
  # --version`, 0.5 s with bytecode (2026-12-06)
  "$venv/bin/uv" pip sync -q --no-config --python "$venv/bin/python" --require-hashes --compile-bytecode \
    "${find_links[@]}" requirements/dev.lock
  "$venv/bin/uv" pip install -q --no-config --python "$venv/bin/python" --no-deps \
    --no-build-isolation -e . -e engine -e testkit
  "$venv/bin/python" -m compileall -q -j 0 src engine testkit >/dev/null
  "$venv/bin/python" -c "import kiln, kiln_engine, kiln_testkit" || { echo "setup.sh: kiln did not install into $venv" >&2; exit 1; }
  # `kiln` on every shell's PATH (root only): the README's commands run outside make too
  [[ $EUID -eq 0 ]] && ln -sf "$PWD/$venv/bin/kiln" /usr/local/bin/kiln
  say "toolchain ready in $venv ($((SECONDS - t0)) s)"
}

# the toolchain installs while apt-get and dockerd work (it needs neither): on a fresh machine
# that hides most of its 17 s
make_venv
toolchain_log=$(mktemp)
setup_toolchain >"$toolchain_log" 2>&1 &
toolchain_pid=$!

need_pkgs=()
command -v dockerd >/dev/null || need_pkgs+=(docker.io)
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
command -v docker-registry >/dev/null || need_pkgs+=(docker-registry)
command -v htpasswd >/dev/null || need_pkgs+=(apache2-utils)
command -v patch >/dev/null || need_pkgs+=(patch)  # the GNU-patch differential test
if ((${#need_pkgs[@]})); then
  say "apt-get install ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
# Debian starts the registry as a service on :5000 where systemd runs; tests start their own
if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
  systemctl stop docker-registry || true
fi

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd"
  mkdir -p /var/log
  (setsid dockerd >/var/log/kiln-dockerd.log 2>&1 &)
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/kiln-dockerd.log" >&2; exit 3; }
fi

wait "$toolchain_pid" || { cat "$toolchain_log" >&2; echo "setup.sh: the dev toolchain did not install (its log is above)" >&2; exit 1; }
cat "$toolchain_log"
# `--no-base` (make test): the base image is built by the first session that needs it,
# after lint and unit, so that a broken test is reported before anything builds
((arm64)) && setup_arm64
((no_base)) || .venv/bin/kiln base build
say "set-up done: $(.venv/bin/kiln --help >/dev/null && echo kiln ready), docker $(docker version -f '{{.Server.Version}}')"
