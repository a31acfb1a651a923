"""Actor-learner: actors write rows and add entries, a learner refreshes and samples.

One process (the learner) creates a replay buffer as a memory-mapped TensorDict in a folder.
Actor processes load the same folder, write transitions into their own rows in place, and one
of them adds a new entry with ``make_memmap``.  The learner sees tensor writes at once (same
memory) and the new entry after ``memmap_refresh_()``, which costs one memory read when nothing
changed.  A shared non-tensor value (``share_non_tensor=True``) carries the actors' status.

Run:  python examples/actor_learner.py
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile

import torch

from tdshare import TensorDict


def actor(rank: int, folder: str, rows_per_actor: int, done: mp.Queue) -> None:
    buffer = TensorDict.load(folder).memmap_()  # maps the learner's files; writes nothing new
    rows = slice(rank * rows_per_actor, (rank + 1) * rows_per_actor)
    buffer["obs"][rows] = float(rank + 1)
    buffer["reward"][rows] = torch.arange(rows_per_actor, dtype=torch.float32)
    if rank == 0:
        # a new entry, visible to the others after memmap_refresh_()
        buffer.make_memmap_from_tensor("priority", torch.ones(buffer.batch_size[0]))
    done.put(rank)


def main(n_actors: int = 2, rows_per_actor: int = 64) -> None:
    size = n_actors * rows_per_actor
    with tempfile.TemporaryDirectory() as root:
        folder = f"{root}/buffer"
        buffer = TensorDict(
            obs=torch.zeros(size, 4), reward=torch.zeros(size), status="collecting", batch_size=[size]
        ).memmap_(folder, share_non_tensor=True)

        ctx = mp.get_context("spawn")
        done = ctx.Queue()
        procs = [ctx.Process(target=actor, args=(r, folder, rows_per_actor, done)) for r in range(n_actors)]
        for p in procs:
            p.start()
        finished = sorted(done.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=120)
        print("actors finished:", finished)

        assert "priority" not in buffer
        buffer.memmap_refresh_()  # maps the entry actor 0 added
        assert buffer["priority"].sum().item() == size
        buffer.set_("status", "learning")  # shared: every process reading it sees the new value

        batch = buffer[torch.randint(0, size, (32,))]
        print("sampled batch:", batch.batch_size, "mean obs", round(batch["obs"].mean().item(), 3))
        assert set(buffer["obs"][:, 0].unique().tolist()) == set(range(1, n_actors + 1))
        print("status:", buffer["status"], "| keys:", sorted(buffer.keys()))


if __name__ == "__main__":
    main()
