#!/usr/bin/env bash
# One-time (idempotent) machine set-up for kiln on Debian/Ubuntu as root:
# system packages, a running Docker daemon, kiln + kiln-engine with dev extras,
# and the air-gapped base image kiln/base:bookworm (not with --no-base).
# --arm64: also qemu emulation of linux/arm64 (only builds for that platform need it):
# Debian's qemu-user-static + binfmt-support, binfmt_misc mounted, qemu-aarch64 enabled.
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
# it changes the kernel's binfmt_misc table for the whole machine
setup_arm64() {
  [[ "$(uname -m)" == "aarch64" ]] && { say "arm64 host: no emulation needed"; return; }
  [[ $EUID -eq 0 ]] || { echo "setup.sh --arm64: needs root (apt-get, mount, update-binfmts)" >&2; exit 77; }
  if ! command -v update-binfmts >/dev/null || ! [[ -e /usr/bin/qemu-aarch64-static || -e /usr/bin/qemu-aarch64 ]]; then
    say "apt-get install qemu-user-static binfmt-support"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user-static binfmt-support >/dev/null
  fi
  if ! [[ -e /proc/sys/fs/binfmt_misc/status ]]; then
    say "mount binfmt_misc"
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || update-binfmts --import qemu-aarch64
  grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
    || { echo "setup.sh --arm64: qemu-aarch64 is not enabled in binfmt_misc" >&2; exit 1; }
  say "linux/arm64 emulation: $(grep -E '^(interpreter|flags)' /proc/sys/fs/binfmt_misc/qemu-aarch64 | tr '\n' ' ')"
}

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

say "pip install -e .[dev] -e engine -e testkit"
python3 -m pip install -q --disable-pip-version-check -e '.[dev]' -e engine -e testkit 2>&1 | grep -v -E '^(WARNING: (Location|Running pip))' || true
python3 -c "import kiln, kiln_engine, kiln_testkit" || { echo "kiln did not install" >&2; exit 1; }

# `--no-base` (make test): the base image is built by the first session that needs it,
# after lint and unit, so that a broken test is reported before anything builds
((arm64)) && setup_arm64
((no_base)) || kiln base build
say "set-up done: $(kiln --help >/dev/null && echo kiln ready), docker $(docker version -f '{{.Server.Version}}')"
