# netlane: the two commands the README starts with.
#
#   make lab    install what is missing, build, run the lab, write a report
#   make test   install what is missing, run every test (root: namespace tests too)

CARGO ?= cargo
NETLANE := target/release/netlane

.PHONY: lab test check setup setup-lab build selftests clean-netns

setup:
	scripts/setup.sh

setup-lab:
	scripts/setup.sh --lab

build: setup
	$(CARGO) build --release --locked -p netlane-cli

selftests: setup-lab
	scripts/build-selftests.sh target/kselftest

lab: setup-lab build selftests
	$(NETLANE) lab $(LAB_ARGS)

# As root (CI, or sudo), namespace and BPF tests must run: a missing privilege fails
# them instead of skipping them.
test: setup
	NETLANE_REQUIRE_PRIVILEGED=$$( [ "$$(id -u)" = 0 ] && echo 1 || echo 0 ) \
	  $(CARGO) test --workspace --locked

check: setup
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

clean-netns:
	$(CARGO) run --release -q -p netlane-cli -- topo clean
