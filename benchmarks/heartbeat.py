"""The cost of progress heartbeats in a training loop: ``python benchmarks/heartbeat.py``.

A ~1 ms training step (a small MLP: forward, backward, SGD step; one torch thread) runs
``--steps`` times in a fresh process, in two variants, alternating which goes first, for
``--reps`` repetitions:

- ``off``: plain torch, nothing of phalanx's installed;
- ``on``: phalanx's worker-side code installed as in a real rank (``phalanx.worker.boot.
  install``, before torch is imported, so the optimizer hook goes in through the import
  hook), every optimizer step bumps the counter, and the loop also calls ``phalanx.step(i)``.

Separate processes differ by more than a heartbeat costs (memory layout, CPU frequency), so a
third measurement runs inside one process: blocks of ``--block`` steps alternate between the
plain loop and the loop with heartbeats (an optimizer post-hook that bumps the counter, as
phalanx's does, plus ``phalanx.step(i)``), ``--blocks`` of each; their medians are compared.

Prints the medians, the ratios, and the cost of one ``phalanx.step()`` /
``phalanx.heartbeat()`` call measured alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(variant: str, steps: int, warmup: int, block: int, blocks: int) -> dict[str, float]:
    scratch = tempfile.mkdtemp(prefix="phalanx-heartbeat-")
    if variant == "on":
        from phalanx.worker import boot

        boot.install({"TORCHELASTIC_ERROR_FILE": str(Path(scratch) / "error.json")})
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    import phalanx
    from phalanx.worker import progress

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(96, 256)
    report = variant == "on"

    def run(count: int, beat: bool) -> float:
        started = time.perf_counter()
        for i in range(count):
            optimizer.zero_grad()
            model(batch).square().mean().backward()
            optimizer.step()
            if beat:
                phalanx.step(i)
        return (time.perf_counter() - started) / count

    if variant == "interleaved":
        progress.open_counters(scratch)
        run(warmup, False)
        plain, beating = [], []

        def beating_block() -> float:
            handle = register_optimizer_step_post_hook(
                lambda *_: phalanx.heartbeat()  # what phalanx's own hook does
            )
            try:
                return run(block, True)
            finally:
                handle.remove()

        for i in range(blocks):  # pairs of blocks, alternating which goes first
            if i % 2 == 0:
                plain.append(run(block, False))
                beating.append(beating_block())
            else:
                beating.append(beating_block())
                plain.append(run(block, False))
        differences = [b - p for p, b in zip(plain, beating, strict=True)]
        return {
            "plain_s": statistics.median(plain),
            "beating_s": statistics.median(beating),
            "difference_s": statistics.median(differences),
        }
    run(warmup, report)
    result = {"step_s": run(steps, report)}
    if report:
        beats, _ = progress.read(str(Path(scratch) / "progress")) or (0, 0)
        result["beats"] = float(beats)
        for name, call in (
            ("step_call_s", lambda: phalanx.step(1)),
            ("beat_call_s", phalanx.heartbeat),
        ):
            n = 200_000
            started = time.perf_counter()
            for _ in range(n):
                call()
            result[name] = (time.perf_counter() - started) / n
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=60)
    parser.add_argument("--child", choices=["on", "off", "interleaved"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(args.child, args.steps, args.warmup, args.block, args.blocks)
        print(json.dumps(result))
        return
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for rep in range(args.reps):
        order = ("off", "on") if rep % 2 == 0 else ("on", "off")
        for variant in order:
            out = subprocess.run(
                [sys.executable, __file__, "--child", variant, "--steps", str(args.steps),
                 "--warmup", str(args.warmup)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            runs[variant].append(json.loads(out))
    off = statistics.median(r["step_s"] for r in runs["off"])
    on = statistics.median(r["step_s"] for r in runs["on"])
    each = (
        [round(r["step_s"] * 1e3, 4) for r in runs["off"]],
        [round(r["step_s"] * 1e3, 4) for r in runs["on"]],
    )
    print(f"{args.reps} reps x {args.steps} steps, alternating; load average {_load()}")
    print(f"off: median {off * 1e3:.4f} ms/step  (each: {each[0]})")
    print(f"on:  median {on * 1e3:.4f} ms/step  (each: {each[1]})")
    print(f"on / off: {on / off:.4f}  ({(on - off) * 1e6:+.2f} us per step)")
    step_call = statistics.median(r["step_call_s"] for r in runs["on"])
    beat_call = statistics.median(r["beat_call_s"] for r in runs["on"])
    print(
        f"one phalanx.step(): {step_call * 1e9:.0f} ns; one phalanx.heartbeat(): {beat_call * 1e9:.0f} ns"
    )
    beats = {int(r["beats"]) for r in runs["on"]}
    expected = 2 * (args.warmup + args.steps)  # the optimizer hook and phalanx.step, per step
    print(f"beats counted per 'on' run: {sorted(beats)} (expected {expected})")
    out = subprocess.run(
        [sys.executable, __file__, "--child", "interleaved", "--warmup", str(args.warmup),
         "--block", str(args.block), "--blocks", str(args.blocks)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    inproc = json.loads(out)
    plain, beating = inproc["plain_s"], inproc["beating_s"]
    print(
        f"one process, {args.blocks} alternating pairs of {args.block}-step blocks: plain "
        f"{plain * 1e3:.4f} ms/step, with heartbeats {beating * 1e3:.4f} ms/step, ratio "
        f"{beating / plain:.4f}; median paired difference {inproc['difference_s'] * 1e6:+.2f} "
        "us per step"
    )


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    main(sys.argv[1:])
