# netlane: the two commands the README starts with.
#
#   make lab    install what is missing, build, run the lab, write a report
#   make test   install what is missing, check formatting and lints, run every test
#               (as root: the namespace, BPF and browser tests too)

CARGO ?= cargo
NETLANE := target/release/netlane
BPF_SOURCES := $(shell find crates/netlane-sys/bpf -name '*.c' -o -name '*.h')

.PHONY: lab test check setup setup-build setup-lab build selftests guest clean-netns install

setup:
	scripts/setup.sh

setup-build:
	scripts/setup.sh --build

setup-lab:
	scripts/setup.sh --lab

build: setup
	$(CARGO) build --release --locked -p netlane-cli

selftests: setup-lab
	scripts/build-selftests.sh target/kselftest

# Debian's kernel, busybox and nvme-cli in an initramfs, for the tests against the
# kernel's own NVMe/TCP host and target under QEMU.
guest: setup
	scripts/build-guest.sh target/guest

lab: setup-lab build selftests
	$(NETLANE) lab $(LAB_ARGS)

# Formatting (Rust and the BPF C) and lints, as CI runs them.
check: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	# The sans-IO protocol cores build alone (what the fuzz targets link).
	$(CARGO) check --locked -p netlane-kv -p netlane-nvme -p netlane-rr -p netlane-lb --no-default-features
	clang-format --dry-run --Werror $(BPF_SOURCES)

# As root (CI, or sudo), namespace, BPF and browser tests must run: a missing
# privilege fails them instead of skipping them. The guest tests always must.
# One cargo invocation for the whole workspace: with one package selection, every crate
# is built once with one set of features (two selections built each workspace crate
# twice). Tests run two at a time, whatever the machine has (the tests that judge what
# they measure assume two CPUs' worth of work beside them at most). Those that judge (the
# quick lab's report and compare's alike runs, the testbed's runs, the agents' merged
# runs) hold a lock of their test file's: beside one of them runs at most a test of its
# file that checks a refusal (test files run one after another).
test: check guest
	NETLANE_REQUIRE_PRIVILEGED=$$( [ "$$(id -u)" = 0 ] && echo 1 || echo 0 ) NETLANE_REQUIRE_GUEST=1 \
	  $(CARGO) test --workspace --locked --no-fail-fast -- --test-threads=2
	# The library's examples run as a user runs them (loopback only; each checks itself).
	# Without -p cargo selects the whole workspace again: the tests' build, reused.
	$(CARGO) run --locked -q --example gso_loopback
	$(CARGO) run --locked -q --example sans_io

install: setup-build
	$(CARGO) install --path crates/netlane-cli --locked

clean-netns:
	$(CARGO) run --release -q -p netlane-cli -- clean
