# shellcheck shell=bash
# llama_src VERSION: print the folder of llama-cpp-python VERSION's source distribution (it
# vendors llama.cpp), unpacked under $CACHE/src; fetched once with pip download (pip's own
# configuration picks the index). Sourced by scripts/build_llama_server and
# scripts/addon/cross_llama_arm64; PYTHON is a python with pip.
llama_src() {
  local version="$1" src="$CACHE/src/llama-cpp-python-$1"
  if [ ! -d "$src/vendor/llama.cpp/tools/server" ]; then
    printf '\033[1m[llama.cpp]\033[0m fetching the llama-cpp-python %s source distribution\n' \
      "$version" >&2
    mkdir -p "$CACHE/src/dl"
    "${PYTHON:-python3}" -m pip download --quiet --no-deps --no-binary :all: \
      "llama-cpp-python==$version" -d "$CACHE/src/dl" >&2
    rm -rf "$src" "$CACHE/src/llama_cpp_python-$version"
    tar -xzf "$CACHE/src/dl/llama_cpp_python-$version.tar.gz" -C "$CACHE/src"
    mv "$CACHE/src/llama_cpp_python-$version" "$src"
  fi
  echo "$src"
}
