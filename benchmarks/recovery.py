"""Recovery from a lost parameter server: a sync job of 3 replicas and 2 PS on a LocalCluster, kill -9 of a PS worker.

Each trial is one job (``cg.train`` of the digits MLP, ``mode="sync"``, 3
replicas, ``checkpoint_every`` steps between the servers' own checkpoints)
on a fresh ``cg.Cluster.local(workers=3, ps=2)``. At a seeded random global
step the worker process of a PS (shard 0, 1, 0, ... in turn) is killed with SIGKILL (its
nanny starts a new one); the job restarts the server, restores the last
checkpoint, publishes the new addresses, and the replicas rejoin.

    python benchmarks/recovery.py [--quick] [--trials N] [--seed S]

What is measured, per trial:

- ``recovery_s``: seconds from the kill to the first global step above the
  restored one (the job trains again). ``max_recovery_s`` over the trials;
  target <= 10 s.
- ``steps_lost``: the global step read just before the kill minus the
  restored step (or the job's own count in its restart event, from the last
  step it saw, when larger). ``max_steps_lost``; target <= ``checkpoint_every``.
- ``finished``: the job reached its last step with status ``finished``;
  ``all_finished`` is the target.

The last line of stdout is one JSON object.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from typing import Any

from _common import emit, machine, parser, setup_threads, source, versions

TARGET_RECOVERY_S = 10.0
CHECKPOINT_EVERY = 20
JOB_TIMEOUT_S = 180.0  # deadline of every wait on a job
POLL_S = 0.01
RESTART_EVENT = re.compile(r"restarted at (.+?); restored (\S+) at global step (\d+): (\d+) step\(s\) lost")


def wait_until(what: str, done: Any, job: Any) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}; job events:\n" + "\n".join(job.events))
        time.sleep(POLL_S)


def ending(job: Any) -> str:
    """How ``job`` ended: its status, and its error when it failed (what the next engineer needs to see)."""
    try:
        job.wait(5.0)
    except Exception as err:  # the job's own error, whatever its type: this is a report
        return f"{job.status}: {err}"
    return str(job.status)


def trial(cg: Any, data: Any, model: Any, rng: random.Random, steps: int, number: int) -> dict[str, Any]:
    """One job with one kill -9 of a PS worker at a random step: its recovery time, steps lost, and end."""
    from cellgraph.cluster.cluster import Cluster

    with Cluster.local(workers=3, ps=2) as cluster:
        job = cg.train(
            model.loss, data, cluster=cluster, optimizer=cg.optim.SGD(0.05), replicas=3, mode="sync",
            batch_size=32, steps=steps, checkpoint_every=CHECKPOINT_EVERY,
        )  # fmt: skip
        try:
            kill_at = rng.randint(CHECKPOINT_EVERY + 1, steps // 2)
            victim_index = number % 2  # both shards, in turn: a seed could otherwise pick the same one every time
            victim = cluster.ps_workers()[victim_index]
            wait_until(f"global step {kill_at}", lambda: job.global_step() >= kill_at, job)
            pid = cluster.client.run(os.getpid, workers=[victim])[victim]
            step_at_kill = job.global_step()
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            found: list[re.Match[str]] = []

            def restarted() -> bool:
                found[:] = [m for e in job.events if (m := RESTART_EVENT.search(e))]
                return bool(found) or job.status != "running"

            wait_until("the restart of the parameter server", restarted, job)
            if not found:
                raise SystemExit(
                    f"trial {number}: the job ended ({ending(job)}) without restarting its server:\n"
                    + "\n".join(job.events)
                )
            # The job counts from the furthest step it knows the lost server reached (its last look, a shard
            # that still answers, the replicas' last metrics: 938bdeb), which is at or past step_at_kill read
            # here before the kill; max() only guards a replica whose last metrics did not get out.
            restored = int(found[0][3])
            lost = max(int(found[0][4]), step_at_kill - restored)
            wait_until(
                f"a global step above {restored}",
                lambda: job.global_step() > restored or job.status != "running",
                job,
            )
            recovery_s = time.monotonic() - killed
            job.wait(JOB_TIMEOUT_S)
            result = {
                "trial": number,
                "kill_at_step": step_at_kill,
                "shard": victim_index,
                "restored_step": restored,
                "steps_lost": lost,
                "recovery_s": recovery_s,
                "finished": job.status == "finished" and job.global_step() == steps,
                "status": job.status,
                "rejoins": sorted(f.result()["rejoins"] for f in job._futures) if job.status == "finished" else None,
            }
        finally:
            job.close()
    print(
        f"trial {number}: killed shard {victim_index}'s PS at step {step_at_kill}; restored step {restored} "
        f"({lost} lost); trained again {recovery_s:.2f} s after the kill; job {result['status']}"
    )
    return result


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=None, help="jobs, one kill each; default 5, --quick 1")
    p.add_argument("--steps", type=int, default=None, help="global steps per job; default 200, --quick 80")
    p.add_argument("--seed", type=int, default=0, help="seeds the kill points and the PS killed")
    args = p.parse_args()
    trials = args.trials or (1 if args.quick else 5)
    steps = args.steps or (80 if args.quick else 200)
    setup_threads(args.threads)
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "critical")
    started = time.perf_counter()

    import cellgraph as cg
    from cellgraph.examples import digits, models

    split = digits.load()
    data = (split.x_train, split.y_train)
    model = models.mlp()
    rng = random.Random(args.seed)
    results = [trial(cg, data, model, rng, steps, n) for n in range(trials)]

    max_recovery = max(r["recovery_s"] for r in results)
    max_lost = max(r["steps_lost"] for r in results)
    all_finished = all(r["finished"] for r in results)
    print(
        f"\n{trials} trial(s), 3 sync replicas, 2 PS, checkpoint_every {CHECKPOINT_EVERY}:\n"
        f"  max_recovery_s  {max_recovery:6.2f}   (target <= {TARGET_RECOVERY_S:g})\n"
        f"  max_steps_lost  {max_lost:6d}   (target <= {CHECKPOINT_EVERY})\n"
        f"  all_finished    {all_finished!s:>6}"
    )
    emit(
        {
            "benchmark": "recovery",
            "max_recovery_s": max_recovery,
            "target_recovery_s": TARGET_RECOVERY_S,
            "recovery_met": max_recovery <= TARGET_RECOVERY_S,
            "max_steps_lost": max_lost,
            "checkpoint_every": CHECKPOINT_EVERY,
            "steps_lost_met": max_lost <= CHECKPOINT_EVERY,
            "all_finished": all_finished,
            "finished_met": all_finished,
            "trials": results,
            "steps": steps,
            "seed": args.seed,
            "threads": args.threads,
            "quick": args.quick,
            "total_s": time.perf_counter() - started,
            "machine": machine(),
            "versions": versions(),
            "source": source(),
        }
    )


if __name__ == "__main__":  # the cluster's worker processes are spawned: they import this file
    main()
