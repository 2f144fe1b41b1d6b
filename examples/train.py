"""A config-driven DDP trainer in TRELLIS.2's shape, deterministic and resumable.

It fits a small MLP to a regression target generated from a fixed seed (no downloads),
checkpoints every ``checkpoint_every`` steps (and at the end) with ``phalanx.checkpoint``,
holds its last step on every rank (``checkpoint.LastStep``: written when the job stops for a
failure), resumes from the newest complete checkpoint in ``--output_dir`` on its own, and
writes ``final.pt``. A run killed at any step and rerun with the same command ends with bit-identical weights, because
everything that varies is a function of the step (data order, dropout seed), the optimizer
state is checkpointed, and kernels and thread counts are fixed.

Three ways to run it::

    # 1. under a launcher (phalanx, torchrun, srun, mpirun): the worker runs directly
    torchrun --standalone --nproc-per-node 2 examples/train.py \\
        --config examples/configs/tiny.json --output_dir out
    # 2. standalone: the script spawns --num_gpus workers itself (CPU workers without CUDA)
    python examples/train.py --config examples/configs/tiny.json --output_dir out --num_gpus 2
    # 3. two nodes: the same command on each, only --node_rank differs
    python examples/train.py --config ... --output_dir out --num_gpus 8 --num_nodes 2 \\
        --node_rank 0 --master_addr node0 --master_port 29500
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Deterministic cuBLAS needs this before CUDA starts; harmless on CPU.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import phalanx
from phalanx import checkpoint, dist
from phalanx.errors import PhalanxError, UsageError
from phalanx.inscript.envs import read_launch_env

# Config keys that count something, so must be >= 1.
_COUNTERS = ("steps", "dataset_size", "global_batch_size", "in_dim", "hidden", "threads",
             "checkpoint_every", "keep", "log_every")  # fmt: skip


@dataclass(frozen=True)
class TrainConfig:
    """Every knob of a run; a JSON config names any subset of these keys."""

    seed: int = 0
    steps: int = 100
    dataset_size: int = 1024
    global_batch_size: int = 32  # split evenly over the workers
    in_dim: int = 16
    hidden: int = 64
    dropout: float = 0.1
    lr: float = 1e-2
    checkpoint_every: int = 10
    keep: int = 2
    log_every: int = 10
    threads: int = 1  # intra-op threads per worker

    @classmethod
    def load(cls, path: str) -> TrainConfig:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--config {path}: {exc}") from None
        if not isinstance(data, dict):
            raise UsageError(f"--config {path}: expected a JSON object, got {type(data).__name__}")
        kinds = {f.name: type(f.default) for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(kinds))
        if unknown:
            raise UsageError(f"--config {path}: unknown keys {unknown}; known: {sorted(kinds)}")
        # An int is fine where a float is expected (JSON writes 1.0 as 1); a bool never is.
        wrong = [
            f"{key} must be {kinds[key].__name__}, got {value!r}"
            for key, value in data.items()
            if isinstance(value, bool) or not isinstance(value, (kinds[key], int))
        ]
        config = cls(**data) if not wrong else cls()
        problems = wrong or config.problems()
        if problems:
            raise UsageError([f"--config {path}: {p}" for p in problems])
        return config

    def problems(self) -> list[str]:
        found = [f"{k} must be >= 1" for k in _COUNTERS if getattr(self, k) < 1]
        if self.global_batch_size >= 1 and self.dataset_size % self.global_batch_size:
            found.append("dataset_size must be a multiple of global_batch_size")
        return found


@dataclass(frozen=True)
class Job:
    """What each worker needs: plain, picklable data (no argparse Namespace)."""

    config: TrainConfig
    output_dir: str
    backend: str


def make_data(cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The same inputs and targets on every worker, from the seed alone."""
    g = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(cfg.dataset_size, cfg.in_dim, generator=g)
    w = torch.randn(cfg.in_dim, 1, generator=g)
    y = torch.sin(x @ w) + 0.1 * torch.randn(cfg.dataset_size, 1, generator=g)
    return x, y


def make_model(cfg: TrainConfig) -> nn.Module:
    torch.manual_seed(cfg.seed)
    return nn.Sequential(
        nn.Linear(cfg.in_dim, cfg.hidden),
        nn.GELU(),
        nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, 1),
    )


def batch_indices(cfg: TrainConfig, step: int, rank: int, world: int) -> torch.Tensor:
    """This worker's share of step ``step``'s global batch: a pure function of the step.

    Each epoch is a fresh permutation seeded by (seed, epoch); step ``s`` takes the s-th
    global batch of it, and worker ``r`` takes every ``world``-th sample from ``r``.
    """
    per_epoch = cfg.dataset_size // cfg.global_batch_size
    epoch, offset = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)
    order = torch.randperm(cfg.dataset_size, generator=g)
    batch = order[offset * cfg.global_batch_size : (offset + 1) * cfg.global_batch_size]
    return batch[rank::world]


def resume(model: nn.Module, opt: torch.optim.Optimizer, ckpt_dir: Path, rank: int) -> int:
    """Load the newest complete checkpoint on rank 0 and broadcast it (no shared disk needed)."""
    box = [checkpoint.load_latest(ckpt_dir) if rank == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    state = box[0]
    if state is None:
        return 0
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])


def train(job: Job, info: dist.DistInfo) -> None:
    cfg, out = job.config, Path(job.output_dir)
    if cfg.global_batch_size % info.world_size:
        raise UsageError(
            f"global_batch_size {cfg.global_batch_size} does not split over "
            f"{info.world_size} workers; hint: make it a multiple of the world size"
        )
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    lead = info.rank == 0
    x, y = (t.to(info.device) for t in make_data(cfg))
    model = make_model(cfg).to(info.device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    start = resume(model, opt, out / "checkpoints", info.rank)
    if lead:
        where = f"resumed from step {start}" if start else "starting at step 0"
        print(f"world size {info.world_size}, {info.backend} on {info.device}; {where}", flush=True)
    ids = [info.device.index] if info.device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids)
    tick, since = time.perf_counter(), start
    # Every rank holds its state after each step (DDP: replicated, so any rank's copy is the
    # job's); a failure's stop writes it, and the next round resumes from the step reached.
    with checkpoint.LastStep(out / "checkpoints", keep=cfg.keep) as last:
        for step in range(start, cfg.steps):
            # Dropout differs per rank and per step, and replays exactly after a resume.
            torch.manual_seed((cfg.seed * 1_000_003 + step) * 1_024 + info.rank)
            idx = batch_indices(cfg, step, info.rank, info.world_size).to(info.device)
            loss = nn.functional.mse_loss(ddp(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done = step + 1
            state = {"step": done, "model": model.state_dict(), "optimizer": opt.state_dict()}
            last.update(done, state)
            if done % cfg.log_every == 0 or done == cfg.steps:
                mean = loss.detach().clone()
                tdist.all_reduce(mean)
                if lead:
                    rate = (done - since) * cfg.global_batch_size / (time.perf_counter() - tick)
                    loss_value = mean.item() / info.world_size
                    print(
                        f"step {done}/{cfg.steps} loss {loss_value:.6f} {rate:.0f} samples/s",
                        flush=True,
                    )
                tick, since = time.perf_counter(), done
            # The last step too: a run stopped at ``steps`` resumes from there, whatever the
            # interval (the soak's reference replays the job's resumes that way).
            if (done % cfg.checkpoint_every == 0 or done == cfg.steps) and lead:
                checkpoint.save(state, out / "checkpoints", done, keep=cfg.keep)
    if lead:
        final = checkpoint.save_file(model.state_dict(), out / "final.pt")
        print(f"wrote {final}", flush=True)
    tdist.barrier()  # nobody leaves before final.pt is on disk


def main_worker(local_rank: int, job: Job) -> None:
    """One worker. ``local_rank`` is passed TRELLIS.2-style; ``dist.init`` reads it too."""
    info = dist.init(backend=job.backend)
    try:
        train(job, info)
    finally:
        tdist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="JSON file of TrainConfig keys")
    parser.add_argument("--output_dir", required=True, help="checkpoints/ and final.pt go here")
    dist.add_dist_args(parser)
    args = parser.parse_args(argv)
    try:
        job = Job(TrainConfig.load(args.config), args.output_dir, args.backend)
        launched = read_launch_env(os.environ)
        if launched is not None:  # form 1: a launcher started one process per worker
            main_worker(launched.local_rank, job)
        else:  # forms 2 and 3: start this node's workers here
            dist.check_node(args.num_nodes, args.node_rank, args.num_gpus)
            if not args.master_port.isdigit():
                raise UsageError(f"--master_port must be a port number, got {args.master_port!r}")
            phalanx.spawn(
                main_worker,
                args=(job,),
                num_gpus=args.num_gpus,
                num_nodes=args.num_nodes,
                node_rank=args.node_rank,
                master_addr=args.master_addr,
                master_port=int(args.master_port),
                backend=args.backend,
            )
    except PhalanxError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
