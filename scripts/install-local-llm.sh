#!/usr/bin/env bash
# Install the local model's server, llama-cpp-python, as a portable build.
#
# pip builds llama.cpp from source, by default for the build machine's own CPU, and caches the wheel by
# version only: a wheel built natively elsewhere (or earlier) can crash on this CPU. So we build it ourselves
# with GGML_NATIVE=OFF, keep that wheel in a folder named for the version *and* the flags, and install it
# from there. pip's own cache is never consulted for it.
#
#   scripts/install-local-llm.sh PYTHON
set -euo pipefail
python=${1:?usage: install-local-llm.sh PYTHON}
version=0.3.36
flags="-DGGML_NATIVE=OFF"
cache=${CAIRN_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cairn/wheels}
dir="$cache/llama-cpp-python-$version-$(echo "$flags" | tr -c 'A-Za-z0-9=_\n' '_')"

if [ "$("$python" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null)" = "$version" ] \
  && [ -f "$("$python" -c 'import sys; print(sys.prefix)')/.llama-portable-$version" ]; then
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time; a second install waits for the first one's wheel
if ! ls "$dir"/llama_cpp_python-"$version"-*.whl >/dev/null 2>&1; then
  echo "Building llama-cpp-python $version for any x86-64/arm64 CPU ($flags); this takes a few minutes once." >&2
  mkdir -p "$dir.tmp"
  CMAKE_ARGS="$flags" "$python" -m pip wheel --quiet --no-cache-dir --no-deps --no-binary llama-cpp-python \
    -w "$dir.tmp" "llama-cpp-python==$version"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
wheel=$(ls "$dir"/llama_cpp_python-"$version"-*.whl | head -n 1)
"$python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$python" -m pip install --quiet "llama-cpp-python[server] @ file://$wheel"
touch "$("$python" -c 'import sys; print(sys.prefix)')/.llama-portable-$version"
