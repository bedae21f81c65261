#!/usr/bin/env python3
"""Wall time of `cordon exec read` (a 2 KB file) for two or more `cordon` binaries, interleaved.

    bench/scripts/startup_compare.py dist/cordon-x86_64-linux target/release/cordon [--rounds N]

Each round runs every binary once, in turn, so load on a shared machine hits all of them alike;
prints per binary the median, the 10th-90th percentile range and the file size. The first
rounds (warm-up: page cache, dynamic loader caches) are not counted.
"""

import argparse
import os
import statistics
import subprocess
import tempfile
import time

WARMUP = 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cordon-startup-") as root:
        with open(os.path.join(root, "two-kb.txt"), "w") as file:
            file.write(("x" * 63 + "\n") * 32)
        samples = {binary: [] for binary in args.binaries}
        for round_index in range(WARMUP + args.rounds):
            for binary in args.binaries:
                start = time.perf_counter_ns()
                subprocess.run(
                    [binary, "exec", "read", '{"path":"two-kb.txt"}', "--root", root],
                    stdout=subprocess.DEVNULL,
                    check=True,
                )
                elapsed = time.perf_counter_ns() - start
                if round_index >= WARMUP:
                    samples[binary].append(elapsed / 1e6)
    for binary, times in samples.items():
        deciles = statistics.quantiles(times, n=10)
        print(
            f"{binary}: median {statistics.median(times):.2f} ms "
            f"(p10 {deciles[0]:.2f}, p90 {deciles[-1]:.2f}; {len(times)} runs), "
            f"{os.path.getsize(binary) / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
