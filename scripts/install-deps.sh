#!/usr/bin/env bash
# Installs the Debian packages PipeFill builds with (idempotent; skips apt when all present).
# The CUDA toolkit is optional: without nvcc the CUDA backend is simply not built.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev libgmock-dev googletest libbenchmark-dev python3 python3-venv
      zlib1g-dev libsimdjson-dev clang-14 postgresql)  # postgresql: the fill-job service tests
pkgs+=(pgbouncer)  # the fill-job service through a transaction pool (tests, bench_service.py)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
