#!/usr/bin/env bash
# Installs the Debian packages crew needs to build, test and run its demo, when any is missing.
# Uses sudo when not root. Quiet when everything is already there.
set -euo pipefail

packages=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libxxhash-dev zlib1g-dev
          libpng-dev libjpeg62-turbo-dev dataset-fashion-mnist chromium
          libopenmpi-dev openmpi-bin iproute2 python3-venv)
# oneDNN: the CPU's GEMMs on x86-64 (CMakeLists.txt, CREW_GEMM); OpenBLAS elsewhere, and in make guard.
[ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] && packages+=(libdnnl-dev)
[ "${CREW_WITH_CLANG:-0}" = 1 ] && packages+=(clang libclang-rt-14-dev)
# The King James Bible (public domain) as text, for `make demo-gpt`: its `bible` program prints it.
[ "${CREW_WITH_KJV:-0}" = 1 ] && packages+=(bible-kjv)
# MPI's other family, for `make mpich`; Open MPI stays the default mpicc and mpirun.
[ "${CREW_WITH_MPICH:-0}" = 1 ] && packages+=(libmpich-dev mpich)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "crew: installing missing Debian packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
