#!/usr/bin/env bash
# One-time (idempotent) machine set-up for kiln on Debian/Ubuntu as root:
# system packages, a running Docker daemon, kiln + kiln-engine with dev extras,
# and the air-gapped base image kiln/base:bookworm (not with --no-base).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '==> %s\n' "$*"; }

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
[[ "${1:-}" == "--no-base" ]] || kiln base build
say "set-up done: $(kiln --help >/dev/null && echo kiln ready), docker $(docker version -f '{{.Server.Version}}')"
