#!/usr/bin/env bash
# Installs what netlane needs on a fresh Debian 12 machine, and only what is missing.
#
#   scripts/setup.sh          packages needed to build and test (clang for BPF, libelf,
#                             zlib, pkg-config, iproute2 and ethtool for inspection,
#                             tshark whose NVMe/TCP dissector checks our PDUs,
#                             clang-format for the BPF C, chromium in which a test
#                             renders the lab's report, qemu-system-x86 and cpio for
#                             the tests against the kernel's NVMe/TCP in a guest,
#                             the Prometheus client library whose parser reads our
#                             metrics, socat as a standard UDP echo server for the
#                             request/response clients, tcpdump to show packet paths
#                             coexist with other capture sockets, and the cache's
#                             real peers: memcached 1.6 to compare against,
#                             libmemcached-tools and python3-pymemcache as clients,
#                             perl to run memcached's own test suite against the
#                             cache (scripts/memcached-suite.sh);
#                             rt-tests, whose cyclictest measures how long this
#                             machine stalls a ready thread: the floor under the kv
#                             scenario's tail latencies; openssh-server, whose sshd
#                             in namespaces stands for the other hosts the lab reaches
#                             over SSH in its tests; systemd, whose systemd-analyze
#                             verifies the unit files in contrib/systemd)
#   scripts/setup.sh --build  only what building netlane needs (clang and llvm for
#                             the BPF programs, libelf, zlib, libbpf headers,
#                             pkg-config, make, gcc): `make install` uses it
#   scripts/setup.sh --lab    also what the lab compares against (the kernel source
#                             package, from which the lab builds the kernel's own
#                             udpgso_bench_tx selftest sender)
#
# Safe to run repeatedly: dpkg is asked first, apt only runs when something is missing.
set -euo pipefail

build=(clang llvm libelf-dev zlib1g-dev pkg-config make gcc libc6-dev libbpf-dev)
want=("${build[@]}" iproute2 ethtool procps xz-utils tshark clang-format chromium
      qemu-system-x86 cpio python3 python3-prometheus-client socat tcpdump memcached
      libmemcached-tools python3-pymemcache rt-tests perl openssh-server systemd)
case "${1:-}" in
  "") ;;
  --build) want=("${build[@]}") ;;
  --lab) want+=(linux-source-6.1) ;;
  *) echo "setup: unknown option ${1} (none, --build or --lab)" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing missing Debian packages: ${missing[*]}"
  if [[ $EUID -ne 0 ]]; then
    echo "setup: need root to install packages (run as root or install them yourself)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Only memcached's binary is wanted (the lab and tests start their own instances on
  # ports of their own); the Debian service would hold port 11211.
  if [[ " ${missing[*]} " == *" memcached "* ]] && [[ -d /run/systemd/system ]]; then
    echo "setup: stopping and disabling the memcached service the package started"
    systemctl disable --now memcached >/dev/null 2>&1 || true
  fi
  # Only sshd's binary is wanted (the tests start their own, in namespaces): a server
  # on this machine's own addresses is not ours to open.
  if [[ " ${missing[*]} " == *" openssh-server "* ]] && [[ -d /run/systemd/system ]]; then
    echo "setup: stopping and disabling the ssh service the package started"
    systemctl disable --now ssh >/dev/null 2>&1 || true
  fi
fi

# Under sudo the toolchain that builds is the invoking user's (sudo's PATH and HOME are
# root's).
user_home="$HOME"
if [[ -n "${SUDO_USER:-}" ]]; then
  user_home="$(getent passwd "$SUDO_USER" | cut -d: -f6)"
fi
if ! command -v cargo >/dev/null 2>&1 && ! [[ -n "${SUDO_USER:-}" && -x "$user_home/.cargo/bin/cargo" ]]; then
  if [[ -x "$user_home/.cargo/bin/cargo" ]]; then
    echo "setup: cargo is in ~/.cargo/bin; add it to PATH" >&2
  else
    echo "setup: no Rust toolchain found; install one with rustup (https://rustup.rs)" >&2
  fi
  exit 1
fi
