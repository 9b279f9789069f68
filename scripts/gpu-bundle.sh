#!/usr/bin/env bash
# scripts/gpu-bundle.sh — what scripts/gpu-check.sh needs on a GPU machine that has no Debian
# packages and no network (the lent H200: a CUDA image with nvcc, CMake and PyTorch, nothing that
# can be fetched there), gathered here into .gpu-bundle/ (git-ignored, carried by the call):
#   debs/           the .deb files of crew's build dependencies (OpenBLAS, cJSON, xxHash, zlib,
#                   libpng, libjpeg-turbo, pkgconf), for Debian 12 amd64; gpu-check.sh unpacks
#                   them with dpkg -x into a prefix of its own and builds against it
#   fashion-mnist/  the gzipped IDX files of Debian's dataset-fashion-mnist (crew prep reads them)
#   kjv.txt.gz      the King James Bible's bytes, where make demo-gpt left them in data/: the
#                   GPT-2 124M row of the benchmark
#
#   scripts/gpu-bundle.sh            then, for the device: carry .gpu-bundle and run
#                                    scripts/gpu-check.sh (docs/GPU.md, "Running the GPU checks")
#
# It prints the bundle's size: the call carries at most 64 MiB, the working tree included.
set -euo pipefail
cd "$(dirname "$0")/.."
B=.gpu-bundle
# Runtime and -dev packages both: the -dev ones hold the headers, .pc files and .so links, the
# others the libraries a linked crew loads. libgfortran5 and libquadmath0 are OpenBLAS's.
PACKAGES=(libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0 libcjson1 libcjson-dev
          libxxhash0 libxxhash-dev zlib1g zlib1g-dev libpng16-16 libpng-dev libjpeg62-turbo
          libjpeg62-turbo-dev pkgconf-bin libpkgconf3)
DATASET=/usr/share/datasets/fashion-mnist

mkdir -p "$B/debs" "$B/fashion-mnist"
if [ ! -d "$DATASET" ]; then
  echo "gpu-bundle: installing dataset-fashion-mnist" >&2
  apt-get install -y -q dataset-fashion-mnist > /dev/null
fi
cp "$DATASET"/*-ubyte.gz "$B/fashion-mnist/"
# the King James Bible's bytes (make demo-gpt writes data/kjv.txt): gpu-check.sh's GPT-2 benchmark
if [ -f data/kjv.txt ]; then gzip -9 -c data/kjv.txt > "$B/kjv.txt.gz"; else rm -f "$B/kjv.txt.gz"; fi
rm -f "$B"/debs/*.deb
(cd "$B/debs" && apt-get download -q "${PACKAGES[@]}" > /dev/null)
missing=0
for p in "${PACKAGES[@]}"; do
  ls "$B/debs/${p}_"*.deb > /dev/null 2>&1 || { echo "gpu-bundle: no .deb of $p" >&2; missing=1; }
done
[ "$missing" = 0 ] || exit 1
# the tree that travels with it: tracked and untracked files git does not ignore
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
bundle=$(du -sb "$B" | cut -f1)
echo "$B: $(ls "$B/debs" | wc -l) packages, the dataset; $((bundle / 1048576)) MiB, with the working tree $(((bundle + tree) / 1048576)) MiB of the 64 MiB a call carries"
[ $((bundle + tree)) -lt $((64 * 1048576)) ] || { echo "gpu-bundle: too large to carry" >&2; exit 1; }
