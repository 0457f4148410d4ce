# The Linux kernel's NVMe/TCP host (nvme-tcp, driven by nvme-cli) against a netlane
# target on the machine running the guest. Runs as the guest's /test.sh after lines
# setting A (the target's address as the guest sees it), P1 and P2 (its two ports) and
# N (the subsystem NQN). Prints "NETLANE-GUEST: ok NAME" or "NETLANE-GUEST: FAIL NAME"
# per check; the test asserts on them. "restart-me" asks the test to restart the target.
mkdir -p /etc/nvme
echo nqn.2014-08.org.nvmexpress:uuid:6e65746c-616e-4500-8000-000000000001 > /etc/nvme/hostnqn
echo 6e65746c-616e-4500-8000-000000000001 > /etc/nvme/hostid

say() { echo "NETLANE-GUEST: $*"; }
# check NAME CMD...: runs CMD; ok, or FAIL with the end of its output.
check() {
  name=$1
  shift
  if out=$("$@" 2>&1); then say "ok $name"; else
    rc=$?
    echo "$out" | tail -n 12
    say "FAIL $name (exit $rc)"
  fi
}
# The first controller of subsystem $N (C) and its namespaces' block devices (B1, B2).
devs() {
  C=
  for cd in /sys/class/nvme/nvme*; do
    if [ "$(cat "$cd/subsysnqn" 2>/dev/null)" = "$N" ]; then C=/dev/${cd##*/}; break; fi
  done
  B1=$(ls /dev/nvme*n1 2>/dev/null | head -n 1)
  B2=${B1%1}2
  [ -n "$C" ] && [ -b "$B1" ] && [ -b "$B2" ]
}
controllers() { for cd in /sys/class/nvme/nvme*; do cat "$cd/subsysnqn" 2>/dev/null; done | grep -c "^$N\$"; }
# datacheck DEV BS COUNT AT direct|buffered TAG: writes COUNT random blocks of BS at
# block AT, reads them back (buffered: after dropping the page cache) and compares.
datacheck() {
  dev=$1 bs=$2 n=$3 at=$4 mode=$5 tag=$6
  dd if=/dev/urandom of=/tmp/w.$tag bs=$bs count=$n iflag=fullblock 2>/dev/null || return 1
  if [ "$mode" = direct ]; then
    dd if=/tmp/w.$tag of=$dev bs=$bs count=$n seek=$at oflag=direct conv=notrunc 2>/dev/null || return 2
    dd if=$dev of=/tmp/r.$tag bs=$bs count=$n skip=$at iflag=direct 2>/dev/null || return 3
  else
    dd if=/tmp/w.$tag of=$dev bs=$bs count=$n seek=$at conv=notrunc,fsync 2>/dev/null || return 2
    echo 3 > /proc/sys/vm/drop_caches
    dd if=$dev of=/tmp/r.$tag bs=$bs count=$n skip=$at 2>/dev/null || return 3
  fi
  cmp /tmp/w.$tag /tmp/r.$tag || return 4
  rm -f /tmp/w.$tag /tmp/r.$tag
}
parallel() {
  pids=
  for j in 0 1 2 3; do
    datacheck "$1" 256K 8 $((j * 8)) direct p$j &
    pids="$pids $!"
  done
  rc=0
  for p in $pids; do wait "$p" || rc=1; done
  return $rc
}
# zeroed DEV BYTES: the first BYTES of DEV read back as zeroes.
zeroed() {
  dd if="$1" of=/tmp/z bs=4096 count=$(($2 / 4096)) iflag=direct 2>/dev/null || return 1
  dd if=/dev/zero of=/tmp/zz bs=4096 count=$(($2 / 4096)) 2>/dev/null
  cmp /tmp/z /tmp/zz
}

# Discovery: the discovery controller lists the subsystem at both ports.
check discover sh -c "nvme discover -t tcp -a $A -s $P1 > /tmp/disc && grep -q 'subnqn:  $N' /tmp/disc && grep -q 'trsvcid: $P2' /tmp/disc"
check connect-all nvme connect-all -t tcp -a $A -s $P1
sleep 1
two_paths() { [ "$(controllers)" -eq 2 ] && [ "$(nvme list-subsys | grep -c live)" -eq 2 ]; }
check multipath-two-controllers two_paths
check block-devices devs
devs
one_node() { [ "$(ls /dev/nvme*n1 | wc -l)" -eq 1 ]; }
check multipath-one-namespace-node one_node

# What nvme-cli users run.
check id-ctrl sh -c "nvme id-ctrl $C | grep -q 'subnqn    : $N'"
check id-ns sh -c "nvme id-ns $B1 | grep -q 'nmic    : 0x1'"
check list-ns sh -c "nvme list-ns $C -o json | tr -d ' \n' | grep -q '\"nsid\":1},{\"nsid\":2'"
check smart-log nvme smart-log $C
check error-log nvme error-log $C
check fw-log nvme fw-log $C
check changed-ns-list-log nvme changed-ns-list-log $C
check get-feature nvme get-feature $C -f 7
check show-regs sh -c "nvme show-regs -H $C | grep -q 'Ready                          (RDY): Yes'"

# Block I/O through the kernel's block layer, data checked.
for bs in 4K 64K 1M 8M; do
  check "direct-$bs-ram" datacheck $B1 $bs 2 1 direct d$bs
  check "direct-$bs-file" datacheck $B2 $bs 2 1 direct f$bs
  check "buffered-$bs-file" datacheck $B2 $bs 2 2 buffered b$bs
done
check parallel-direct parallel $B1
check flush nvme flush $B2

# Compare, Dataset Management, Write Zeroes, Verify.
dd if=/dev/urandom of=/tmp/c bs=4096 count=1 2>/dev/null
dd if=/tmp/c of=$B1 bs=4096 count=1 oflag=direct 2>/dev/null
check compare-equal nvme compare $B1 -s 0 -c 0 -z 4096 -d /tmp/c
check compare-differs sh -c "nvme compare $B1 -s 0 -c 0 -z 4096 -d /dev/zero 2>&1 | grep -q 'Compare Failure'"
check dsm-deallocate nvme dsm $B1 --ad -s 0 -b 1
check dsm-reads-zeroes zeroed $B1 4096
dd if=/dev/urandom of=$B2 bs=1M count=1 oflag=direct 2>/dev/null
check blkdiscard blkdiscard -o 0 -l 1048576 $B2
check discard-reads-zeroes zeroed $B2 1048576
dd if=/dev/urandom of=$B1 bs=64K count=1 oflag=direct 2>/dev/null
check write-zeroes nvme write-zeroes $B1 -s 0 -c 15
check write-zeroes-reads-zeroes zeroed $B1 65536
check verify nvme verify $B1 -s 0 -c 7

# Keep-alive across idle time (Linux sends one every KATO/2; KATO is 5 s), then reset.
sleep 12
idle_ok() { [ "$(nvme list-subsys | grep -c live)" -eq 2 ] && datacheck $B1 4K 1 3 direct ka; }
check keep-alive-idle idle_ok
check reset nvme reset $C
sleep 2
check after-reset datacheck $B1 64K 1 5 direct rs
gone() { nvme disconnect-all && [ "$(controllers)" -eq 0 ]; }
check disconnect-all gone

# Digests: each combination, with data.
for dg in none hdr data both; do
  case $dg in
    none) opt= ;; hdr) opt=--hdr-digest ;; data) opt=--data-digest ;; both) opt="--hdr-digest --data-digest" ;;
  esac
  check "connect-digest-$dg" nvme connect -t tcp -a $A -s $P1 -n $N $opt
  sleep 1
  devs
  check "digest-$dg-io" datacheck $B1 4K 2 7 direct g4
  check "digest-$dg-io-r2t" datacheck $B2 1M 2 3 direct g1
  check "disconnect-digest-$dg" nvme disconnect -n $N
done

# The target restarts during I/O: the host reconnects, no acknowledged write is lost.
check connect-reconnecting nvme connect -t tcp -a $A -s $P1 -n $N --reconnect-delay=1 --ctrl-loss-tmo=60
sleep 1
devs
dd if=/dev/urandom of=/tmp/pat bs=64K count=48 2>/dev/null
say restart-me
i=0
acked=
while [ $i -lt 48 ]; do
  if dd if=/tmp/pat of=$B2 bs=64K count=1 skip=$i seek=$((64 + i)) oflag=direct conv=notrunc 2>/dev/null; then
    acked="$acked $i"
  fi
  i=$((i + 1))
  sleep 0.2
done
lost=0
for i in $acked; do
  dd if=$B2 of=/tmp/back bs=64K count=1 skip=$((64 + i)) iflag=direct 2>/dev/null
  dd if=/tmp/pat of=/tmp/want bs=64K count=1 skip=$i 2>/dev/null
  cmp -s /tmp/back /tmp/want || lost=$((lost + 1))
done
say "restart: $(echo $acked | wc -w) writes acknowledged, $lost lost"
check restart-reconnected sh -c "dmesg | grep -q 'Successfully reconnected'"
none_lost() { [ "$lost" -eq 0 ] && [ "$(echo $acked | wc -w)" -ge 40 ]; }
check restart-nothing-lost none_lost
nvme disconnect-all >/dev/null 2>&1
say finished
