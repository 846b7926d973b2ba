#!/usr/bin/env bash
# Installs what the build and the tests need, and only what is missing.
# Debian packages through apt (as root or through sudo), Python test packages through pip.
set -euo pipefail

debs=(
  build-essential cmake make pkg-config git ccache
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libspdlog-dev libfmt-dev
  libpcre2-dev libicu-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev
  libomp-dev clang libclang-rt-14-dev clang-format
  python3 python3-pip
  gnuplot-nox
  chromium
)
py_pkgs=(pytest openai requests safetensors numpy)

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${debs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

py=python3
py_missing=()
for m in "${py_pkgs[@]}"; do
  if ! "$py" -c "import $m" 2>/dev/null; then py_missing+=("$m"); fi
done
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "install-deps: installing Python packages: ${py_missing[*]}"
  "$py" -m pip install -q --disable-pip-version-check "${py_missing[@]}" 2>&1 ||
    "$py" -m pip install -q --disable-pip-version-check --break-system-packages "${py_missing[@]}"
fi
