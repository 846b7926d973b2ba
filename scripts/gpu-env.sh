# Sourced by scripts/gpu-test.sh. When .gpu-bundle/ exists (made by `make gpu-bundle` on a connected machine),
# unpacks its libraries into $MS_BUNDLE_ROOT once and points CMake and Python at them; otherwise does nothing,
# and the build uses what the system has. Needs no root and no registry.
ms_bundle=${MS_BUNDLE:-.gpu-bundle}
MS_BUNDLE_CMAKE_ARGS=()
if [ -f "$ms_bundle/deps.tar.xz" ]; then
  MS_BUNDLE_ROOT=${MS_BUNDLE_ROOT:-$PWD/${build:-build-gpu}/bundle-root}
  stamp="$MS_BUNDLE_ROOT/.unpacked"
  if [ ! -f "$stamp" ] || [ "$ms_bundle/deps.tar.xz" -nt "$stamp" ]; then
    rm -rf "$MS_BUNDLE_ROOT" && mkdir -p "$MS_BUNDLE_ROOT"
    tar -C "$MS_BUNDLE_ROOT" -xJf "$ms_bundle/deps.tar.xz" && touch "$stamp"
  fi
  MS_BUNDLE_CMAKE_ARGS=(-DCMAKE_PREFIX_PATH="$MS_BUNDLE_ROOT/usr" -DICU_ROOT="$MS_BUNDLE_ROOT/usr"
    -DMOESERVE_BUNDLE_RPATH=ON)
  echo "gpu-env: using the dependency bundle in $ms_bundle"
  if compgen -G "$ms_bundle/wheels/*.whl" >/dev/null; then
    site="$MS_BUNDLE_ROOT/site"
    if [ ! -d "$site" ]; then
      rm -rf "$site.tmp"
      if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$site.tmp" "$ms_bundle"/wheels/*.whl; then
        mv "$site.tmp" "$site"
      else
        echo "gpu-env: the bundled wheels do not install here (they are for CPython 3.12); e2e tests may skip"
      fi
    fi
    [ -d "$site" ] && export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
