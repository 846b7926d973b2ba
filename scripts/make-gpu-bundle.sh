#!/usr/bin/env bash
# `make gpu-bundle`: on a connected Debian 12 machine, writes what the GPU build needs from outside the CUDA
# toolkit into .gpu-bundle/ (git-ignored), for GPU machines that have the toolkit and a compiler but no package
# registry:
#   deps.tar.xz   the headers, CMake packages and shared libraries of the Debian packages below, trimmed to what
#                 the build links (no static ICU/OpenSSL, no docs), unpacked by scripts/gpu-env.sh
#   wheels/       the official openai client and its dependencies for Python 3.12 (e2e tests on the GPU machine)
#   MANIFEST      package versions, for the record
# The binaries built against it carry an RPATH (not RUNPATH) to the unpacked libraries, so nothing needs
# LD_LIBRARY_PATH or root on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-bundle
pkgs=(
  libpcre2-dev libpcre2-8-0 libicu-dev libicu72 libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3
  libbrotli-dev libbrotli1 zlib1g-dev libxxhash-dev libxxhash0 nlohmann-json3-dev libcli11-dev libspdlog-dev
  libspdlog1.10 libfmt-dev libfmt9 libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
)
py_pkgs=(openai)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "gpu-bundle: downloading ${#pkgs[@]} Debian packages"
(cd "$work" && apt-get download "${pkgs[@]}" >/dev/null)
mkdir -p "$work/root"
for f in "$work"/*.deb; do dpkg -x "$f" "$work/root"; done
lib="$work/root/usr/lib/x86_64-linux-gnu"
# Trim: ICU beyond the common library and its data, static archives the build never links, docs, tools.
rm -rf "$work/root/usr/share/doc" "$work/root/usr/share/man" "$work/root/usr/share/lintian" \
  "$work/root/usr/bin" "$work/root/usr/sbin" "$work/root/usr/lib/icu" "$lib/engines-3" "$lib/ossl-modules"
find "$lib" \( -name 'libicu*.a' -o -name 'libicui18n*' -o -name 'libicuio*' -o -name 'libicutu*' \
  -o -name 'libicutest*' -o -name 'libcrypto.a' -o -name 'libssl.a' -o -name 'libpcre2-16*' \
  -o -name 'libpcre2-32*' -o -name 'libpcre2-posix*' -o -name 'libbrotli*.a' -o -name 'libxxhash.a' \
  -o -name 'libz.a' -o -name 'libpcre2-8.a' \) -delete
rm -rf "$out"
mkdir -p "$out/wheels"
tar -C "$work/root" -cJf "$out/deps.tar.xz" usr
for f in "$work"/*.deb; do dpkg-deb -f "$f" Package Version | paste -sd' '; done >"$out/MANIFEST"

echo "gpu-bundle: downloading Python wheels (${py_pkgs[*]} and dependencies, CPython 3.12)"
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$out/wheels" "${py_pkgs[@]}"
ls "$out/wheels" | sed 's/^/wheel /' >>"$out/MANIFEST"
echo "gpu-bundle: $(du -sh "$out" | cut -f1) in $out"
