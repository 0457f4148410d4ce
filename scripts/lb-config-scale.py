#!/usr/bin/env python3
"""How `netlane lb run` copes with a big configuration (the numbers in docs/results.md,
"Hostile inputs and faults"). Writes a configuration of VIPS x REALS reals, runs the
balancer on loopback (generic XDP, statistics every second, /metrics fetched every
0.2 s), changes one real's weight 5 s after it is ready (the file renamed into place),
and prints: time to ready, time from the edit to "applied", statistics lines and the
largest gap between them, the slowest /metrics fetch, and the peak RSS.

    scripts/lb-config-scale.py target/release/netlane --vips 8 --reals 65536 --ring 262139

Needs root (XDP). Traffic stays on loopback; the process is ended by its -t.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def write_config(path, vips, reals, ring):
    with open(path, "w") as f:
        f.write(f"ring_size = {ring}\n")
        for v in range(vips):
            f.write(f'[[vip]]\naddress = "10.100.0.{v + 1}"\nport = 80\nproto = "tcp"\n')
            for r in range(reals):
                f.write(f'[[vip.real]]\naddress = "10.{10 + v}.{r >> 8}.{r & 255}"\n')


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("netlane")
    p.add_argument("--vips", type=int, default=8)
    p.add_argument("--reals", type=int, default=65536, help="reals per VIP")
    p.add_argument("--ring", type=int, default=262139)
    p.add_argument("--port", type=int, default=9911)
    a = p.parse_args()
    if a.vips < 1 or a.vips > 200 or a.reals < 1 or a.reals > 65536:
        sys.exit("--vips must be 1..=200 and --reals 1..=65536 (addresses are 10.<10+vip>.<hi>.<lo>)")
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "lb.toml")
        write_config(cfg, a.vips, a.reals, a.ring)
        t0 = time.time()
        proc = subprocess.Popen(
            [a.netlane, "lb", "run", "--config", cfg, "--iface", "lo", "--gateway-mac", "02:00:00:00:00:01",
             "--generic", "--max-vips", str(max(16, a.vips)), "--max-reals", str(2 * a.vips * a.reals),
             "--stats-interval", "1s", "--metrics-addr", f"127.0.0.1:{a.port}", "-t", "20s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []

        def read():
            for line in proc.stdout:
                lines.append((time.time() - t0, line.rstrip()))

        reader = threading.Thread(target=read)
        reader.start()
        while not any("metrics on" in l for _, l in lines):
            if proc.poll() is not None:
                reader.join()
                sys.exit("lb run ended before it was ready:\n" + "\n".join(l for _, l in lines))
            time.sleep(0.05)
        ready = next(t for t, l in lines if "metrics on" in l)
        time.sleep(5)
        text = open(cfg).read().replace('address = "10.10.0.5"\n', 'address = "10.10.0.5"\nweight = 2\n', 1)
        with open(cfg + ".new", "w") as f:
            f.write(text)
        edited = time.time() - t0
        os.rename(cfg + ".new", cfg)
        fetches, rss_kib = [], 0
        while proc.poll() is None:
            start = time.time()
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{a.port}/metrics", timeout=30).read()
                fetches.append(time.time() - start)
            except OSError:
                pass
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    for l in f:
                        if l.startswith("VmHWM:"):
                            rss_kib = int(l.split()[1])
            except OSError:
                pass
            time.sleep(0.2)
        reader.join()
        applied = [t for t, l in lines if "applied the changed" in l]
        stats = [t for t, l in lines if l.startswith("[")]
        gaps = [b - a for a, b in zip(stats, stats[1:])] or [float("nan")]
        print(f"{a.vips * a.reals} reals: ready {ready:.2f} s; edit applied "
              f"{(applied[0] - edited) if applied else float('nan'):.2f} s after the write; "
              f"{len(stats)} statistics lines, largest gap {max(gaps):.2f} s; "
              f"/metrics fetches {len(fetches)}, slowest {max(fetches or [float('nan')]):.2f} s; "
              f"peak RSS {rss_kib // 1024} MiB")
        for _, l in lines:
            if "not written" in l or "kept the running" in l:
                print(l)


if __name__ == "__main__":
    main()
