"""Preprocess a memory-mapped dataset in worker processes with ``map`` and ``map_iter``.

The dataset is memory-mapped once; ``map`` splits it into one chunk per worker, and each spawned
worker receives its chunk as a handle to the same files (never a copy of the rows), runs
``normalize`` on it and sends the result back, which ``map`` joins in order.  ``out=`` gives a
memory-mapped output that the workers fill themselves.  ``map_iter`` yields the results batch by
batch, like a data loader, and leaving its loop early stops its workers.

Run:  python examples/map_chunks.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile

import torch

from tdshare import TensorDict


def normalize(chunk: TensorDict) -> TensorDict:
    """Runs in a worker: a new tensordict with the chunk's observations scaled to [0, 1]."""
    obs = chunk["obs"]
    return TensorDict(obs=obs / 255.0, label=chunk["label"], batch_size=chunk.batch_size)


def main(rows: int = 100_000) -> None:
    with tempfile.TemporaryDirectory() as folder:
        data = TensorDict(
            obs=(torch.arange(rows * 4) % 256).float().reshape(rows, 4),
            label=torch.arange(rows) % 10,
            batch_size=[rows],
        ).memmap_(os.path.join(folder, "data"))
        seeds = torch.Generator().manual_seed(0)  # the workers' seeds: base + worker number
        # the default start method (fork on Linux); mp_start_method="spawn" or "forkserver" work alike

        result = data.map(normalize, num_workers=2, generator=seeds)
        print(f"map: {result.batch_size[0]} rows, max obs {result['obs'].max().item():.1f}")

        out = TensorDict(obs=torch.zeros(rows, 4), label=torch.zeros(rows, dtype=torch.int64), batch_size=[rows])
        out.memmap_(os.path.join(folder, "out"))  # the workers write their parts into these files
        data.map(normalize, num_workers=2, chunksize=25_000, out=out, generator=seeds)
        print(f"out filled by the workers: {bool((out['obs'] == result['obs']).all())}")

        batches = data.map_iter(normalize, num_workers=2, chunksize=10_000, generator=seeds)
        sizes = []
        for batch in batches:
            sizes.append(batch.batch_size[0])
            if len(sizes) == 3:
                break  # leaving early: map_iter's workers are stopped
        batches.close()
        print(f"map_iter: stopped after 3 batches of {sizes[-1]}; workers left: {len(mp.active_children())}")
        del result, out, data, batch


if __name__ == "__main__":
    main()
