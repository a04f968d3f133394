"""A job's lost parameter servers: wait for Dask to restart them, give them the job, restore, tell the replicas.

The supervisor's calls to a server fail (``UNAVAILABLE``); the nanny restarts
the PS worker and the scheduler sends it the job's plugin, which starts a
new server; the job gives it the job (``init``), restores the last checkpoint
it wrote, and publishes the new addresses in the ``distributed.Variable``
``ps_variable(job_id)``, where the replicas look when their servers stop
answering. The event says how many steps were lost: at most
``checkpoint_every``, as the servers checkpoint by themselves at every
multiple of it; the job learns of each checkpoint from ``Stats``.

Examples
--------
>>> PROBE_TIMEOUT_S  # a server that does not answer Stats within this is counted as lost
5.0
"""

from __future__ import annotations

import time

from cellgraph.dataflow.errors import CellgraphError

from .errors import ParameterServerError
from .job_state import JobState
from .job_tasks import ps_variable
from .ps import ParameterClient
from .ps.checkpoint import list_checkpoints
from .training_graph import TrainingError
from .worker_watch import WorkerWatch

# The deadline of the calls that look at one parameter server.
PROBE_TIMEOUT_S = 5.0


def publish_addresses(state: JobState) -> None:
    """Tell the replicas where the servers are now (they read it when theirs stop answering)."""
    import distributed

    value = {"generation": state.generation, "addresses": list(state.addresses)}
    distributed.Variable(ps_variable(state.job_id), client=state.cluster.client).set(value)


def complete_checkpoints(state: JobState) -> list[str] | None:
    """The checkpoints complete on every shard in the job's folder, oldest first; None when this process cannot
    read the folder (it lives on the PS machines only)."""
    shards = len(state.addresses)
    if not shards or not state.checkpoint_dir.is_dir():
        return None
    try:
        names = [
            {info.name: info.step for info in list_checkpoints(state.checkpoint_dir, s, shards)} for s in range(shards)
        ]
    except (CellgraphError, OSError):
        return None
    common = set(names[0]).intersection(*names[1:])
    return sorted(common, key=lambda n: names[0][n])


class ServerRecovery:
    """Restarts the job's lost parameter servers (``restart``), from the supervisor's thread."""

    def __init__(self, state: JobState, watch: WorkerWatch) -> None:
        self.state = state
        self.watch = watch
        self._metrics_from = 0  # the replicas' metrics since the last restart: those of the servers lost now

    def restart(self, err: ParameterServerError, since: float | None = None) -> bool:
        """Servers stopped answering: wait for Dask to restart them, restore, publish; False if the job failed or was
        closed meanwhile. ``job.global_step()`` says the step last read meanwhile (``state.recovering``).

        ``since`` (monotonic): when the call that failed with ``err`` began. The whole wait ends at most
        ``2 * timeout_s`` after it: a server that stopped answering (SIGSTOP, a network cut) fails a call only at
        its deadline, and waiting ``timeout_s`` more from there, after the probes, had the job fail 4-5 times
        ``timeout_s`` after the loss. A server killed outright fails at once and still gets ``timeout_s``.
        """
        self.state.recovering = True
        try:
            return self._restart(err, time.monotonic() if since is None else since)
        finally:
            self.state.recovering = False

    def _restart(self, err: ParameterServerError, since: float) -> bool:
        state = self.state
        timeout = state.spec.timeout_s
        deadline = since + 2 * timeout
        seen_at, ago = self._reached(), time.monotonic() - state.step_time
        answers = {a: self._answers(a, deadline) for a in state.addresses}
        dead = [a for a, step in answers.items() if step is None]
        if not dead:
            state.event(f"the parameter servers answer again after: {err}")
            return True
        # The scheduler has most likely seen the PS worker go by now: its "lost worker" event comes first, as it
        # happened first (this thread is busy here for as long as the restart takes).
        self.watch.look()
        who = "; ".join(self._describe_server(a) for a in dead)
        self.find_newer_checkpoint()
        point = state.restore_point or "nothing (no checkpoint yet: training starts again from step 0)"
        wait = max(0.0, min(timeout, deadline - time.monotonic()))
        bound = (
            f" (it stopped answering {time.monotonic() - since:.1f} s ago, and a lost server fails the job within "
            f"2 x timeout_s={timeout:g} s of that)"
            if wait < timeout - 0.05
            else ""
        )
        state.event(
            f"{who} did not answer (last seen at global step {seen_at}, {ago:.1f} s ago): {err}. "
            f"The job waits up to {wait:.3g} s for Dask to restart it{bound}, then restores {point}; "
            "the replicas wait for it and rejoin"
        )
        try:
            # The job's servers only: the first ones, those the placement gave a part of the model (Supervisor.start).
            found = state.cluster.parameter_servers(state.job_id, timeout=wait, replacing=dead, cancel=state.closed)
            addresses = list(found)[: len(state.addresses)]
            self.watch.look()  # the restarted worker joined before its server restores: say so in that order
            ps = ParameterClient(addresses, state.token, timeout=timeout)
            placement = state.placed.placement if state.placed is not None else None
            ps.init(
                state.job_id, state.spec.graph.initial, state.spec.optimizer, state.training,
                placement=placement, moving=dict(zip(state.spec.graph.states, state.spec.graph.state_momenta)),
            )  # fmt: skip
            step = ps.restore(state.restore_point) if state.restore_point else 0
        except CellgraphError as problem:
            if state.closed.is_set():
                return self._closed_meanwhile(dead)
            if state.scheduler_lost():
                return False  # the job has failed saying so: no server can come back without the scheduler
            state.error = TrainingError(
                f"job {state.job_id}: its parameter server(s) {', '.join(dead)} were lost and could not be restarted: "
                f"{problem}.{self._stuck(dead)} The job has failed: job.close() ends it, and "
                + (
                    f"cg.train(..., resume_from={state.restore_point!r}) starts again from its last checkpoint"
                    if state.restore_point
                    else "cg.train(...) starts it again"
                )
            )
            state.servers_lost = True
            state.event(str(state.error))
            state.signal_stop()  # the replicas waiting for new servers end now, not at their deadline
            return False
        if state.closed.is_set():
            # close_job has stopped (or is stopping) the servers and forgotten the job's client: a new one set
            # now would outlive the job, and new addresses published would bring back the Dask variable it deleted.
            ps.close()
            return self._closed_meanwhile(dead)
        old, state.ps = state.ps, ps
        if old is not None:
            old.close()
        state.addresses, state.generation = list(addresses), state.generation + 1
        publish_addresses(state)
        # Counted from the furthest step the lost servers are known to have reached: the replicas said theirs as
        # their servers stopped answering (while the job waited here), and a shard that still answered said its
        # own. Before, from the job's last look before the loss alone, which lags the servers by a second or more
        # (a job killed at step 92 said '1 step(s) lost' of its restore to 50).
        alive = [s for s in answers.values() if s is not None]
        seen_at = max(seen_at, self._reached(), *alive)
        self._metrics_from = len(state.metrics)
        state.step, state.step_time = step, time.monotonic()
        lost = max(0, seen_at - step)
        state.event(
            f"parameter server(s) of job {state.job_id} restarted at {', '.join(addresses)}; restored "
            f"{state.restore_point or 'the initial values'} at global step {step}: {lost} step(s) lost "
            f"(checkpoints at most every {state.spec.checkpoint_every} steps); the replicas rejoin there"
        )
        return True

    def _closed_meanwhile(self, dead: list[str]) -> bool:
        """The job was closed while its servers restarted: it stays stopped, with no new servers and no error."""
        self.state.event(
            f"the job was closed while its parameter server(s) {', '.join(dead)} restarted: they are not restarted, "
            "and the job stays stopped"
        )
        return False

    def find_newer_checkpoint(self) -> None:
        """Look in the checkpoint folder, where this process can read it, for a checkpoint newer than ``Stats`` last
        said (a server may have written one since, just before it was lost), complete on every shard."""
        state = self.state
        names = complete_checkpoints(state)
        if not names:
            return  # none, or the folder is on the PS machines only: Stats's account stands
        name = names[-1]
        shards = len(state.addresses)
        step = next(info.step for info in list_checkpoints(state.checkpoint_dir, 0, shards) if info.name == name)
        if step > state.restore_step:
            state.restore_point, state.restore_step = name, step
            with state.lock:
                if name not in state.checkpoints:
                    state.checkpoints.append(name)

    def _reached(self) -> int:
        """The furthest global step the job knows its servers reached: its own last look, or a later one the
        replicas reported since the last restart (older ones are of servers restored since)."""
        state = self.state
        with state.lock:
            reported = max((int(m.get("step", 0)) for m in state.metrics[self._metrics_from :]), default=0)
        return max(state.step, reported)

    def _answers(self, address: str, deadline: float) -> int | None:
        """The global step of the server at ``address``, if it answers ``Stats`` within ``PROBE_TIMEOUT_S`` (and
        before ``deadline``, the end of the recovery's wait)."""
        left = min(PROBE_TIMEOUT_S, max(0.1, deadline - time.monotonic()))
        probe = ParameterClient([address], self.state.token, timeout=left)
        try:
            [stats] = probe.stats()
        except ParameterServerError:
            return None
        finally:
            probe.close()
        return int(stats.global_step)

    def _stuck(self, dead: list[str]) -> str:
        """Words for the dead servers' PS workers that are still in the cluster: stopped or cut off, not lost, so
        that Dask restarts nothing (the cluster's own error asks whether it restarts lost workers)."""
        self.watch.look()
        hosts = [self.watch.ps_host(self.state.addresses.index(a)) for a in dead]
        there = [h.address for h in hosts if h is not None and h.address in self.watch.workers]
        if not there:
            return ""
        return (
            f" PS worker(s) {', '.join(there)} are still in the cluster, and their server gave no answer: a worker "
            "stopped (SIGSTOP), hung or cut off from the network, which Dask does not restart."
        )

    def _describe_server(self, address: str) -> str:
        shard = self.state.addresses.index(address)
        ps = self.watch.ps_host(shard)
        host = f"; worker {ps.address}, name {ps.name}, role ps, task {shard}" if ps else ""
        return f"parameter server {address} (shard {shard}{host})"


__all__ = ["PROBE_TIMEOUT_S", "ServerRecovery", "complete_checkpoints", "publish_addresses"]
