#!/usr/bin/env bash
# Runs memcached 1.6.18's own test files (t/*.t from Debian's source package) against a
# server, the way memcached's `make test` runs them: each file starts the server it
# tests through t/lib/MemcachedTest.pm's new_memcached(), which runs ./memcached-debug.
#
#   scripts/memcached-suite.sh [--server netlane|memcached] [--jobs N] [--out DIR] FILE...
#
#   --server netlane    (default) memcached-debug is `netlane kv serve --debug-time`
#                       ($NETLANE, else target/release/netlane)
#   --server memcached  memcached-debug is built from the same source (needs gcc, make
#                       and libevent-dev), for the same files against memcached itself
#   FILE                a test file's name under t/ (getset.t, ...)
#
# The source is fetched once into target/memcached-suite/ with `apt-get source`, from a
# deb-src entry of the script's own (the machine's apt configuration is not changed),
# and never committed. Each file's TAP goes to DIR/<file>.tap (its stderr, the server's
# output included, to DIR/<file>.log); then prove, the suite's own runner, reads them
# back and prints its tally. Exit status: prove's (0 when every file passed).
#
# Every server a test starts runs under our timedrun, which records its PID; what is
# still running when the files are done is stopped by that PID.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
server=netlane
jobs=2
out=""
files=()
while (($#)); do
  case "$1" in
    --server) server="$2"; shift 2;;
    --jobs) jobs="$2"; shift 2;;
    --out) out="$2"; shift 2;;
    -h|--help) sed -n '2,20p' "$0"; exit 0;;
    -*) echo "memcached-suite: unknown option $1" >&2; exit 2;;
    *) files+=("$1"); shift;;
  esac
done
((${#files[@]})) || { echo "memcached-suite: name the test files to run (getset.t ...)" >&2; exit 2; }
[[ "$server" == netlane || "$server" == memcached ]] || { echo "memcached-suite: --server netlane or memcached" >&2; exit 2; }
for tool in perl prove apt-get tar timeout; do
  command -v "$tool" >/dev/null || { echo "memcached-suite: $tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done

base="$root/target/memcached-suite"
src="$base/src/memcached-1.6.18"
if [[ ! -f "$src/t/lib/MemcachedTest.pm" ]]; then
  apt="$base/apt"
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$base/src"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
    > "$apt/sources.list"
  opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Sandbox::User=root"
        -o "Debug::NoLocking=1")
  echo "memcached-suite: fetching memcached's Debian source package" >&2
  apt-get "${opts[@]}" -qq update
  (cd "$base/src" && apt-get "${opts[@]}" -qq source --download-only memcached)
  orig="$base/src/memcached_1.6.18.orig.tar.xz"
  [[ -f "$orig" ]] || { echo "memcached-suite: Debian's source is not memcached 1.6.18 ($(ls "$base/src"))" >&2; exit 1; }
  tar -C "$base/src" -xf "$orig"
fi

run="$base/run-$server"
rm -rf "$run"
mkdir -p "$run"
cp -r "$src/t" "$run/t"
out="${out:-$run/out}"
mkdir -p "$out"
pids="$run/pids"
: > "$pids"

if [[ "$server" == netlane ]]; then
  netlane="${NETLANE:-$root/target/release/netlane}"
  [[ -x "$netlane" ]] || { echo "memcached-suite: $netlane not built (cargo build --release -p netlane-cli)" >&2; exit 1; }
  netlane="$(realpath "$netlane")"
  # The suite reads `memcached-debug -h` for what the server supports; the server's own
  # lines go to stderr, as memcached prints nothing on stdout.
  cat > "$run/memcached-debug" <<EOF
#!/usr/bin/env bash
case " \$* " in *" -h "*) exec "$netlane" kv serve "\$@";; esac
exec "$netlane" kv serve --debug-time "\$@" 1>&2
EOF
else
  if [[ ! -x "$src/memcached-debug" ]]; then
    echo "memcached-suite: building memcached-debug from the source" >&2
    (cd "$src" && ./configure -q >/dev/null && make -s -j2 memcached-debug >/dev/null)
  fi
  ln -s "$src/memcached-debug" "$run/memcached-debug"
fi
chmod +x "$run/memcached-debug"
# memcached's timedrun, ours: a time limit, and the PID written down for the cleanup.
cat > "$run/timedrun" <<EOF
#!/usr/bin/env bash
echo \$\$ >> "$pids"
t=\$1; shift
exec timeout --kill-after=5 "\$t" "\$@"
EOF
chmod +x "$run/timedrun"

cleanup() {
  while read -r pid; do
    # Ours only: a timeout we started, still running.
    if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == timeout ]]; then kill -TERM "$pid" 2>/dev/null || true; fi
  done < "$pids"
}
trap cleanup EXIT

cd "$run"
printf '%s\n' "${files[@]}" | xargs -P "$jobs" -I{} sh -c \
  'timeout 300 perl "t/$1" > "$2/$1.tap" 2> "$2/$1.log"; echo "$?" > "$2/$1.status"' _ {} "$out"
# prove, the suite's runner, tallies what the files printed.
taps=()
for f in "${files[@]}"; do taps+=("$f.tap"); done
cd "$out"
prove --exec cat "${taps[@]}"
