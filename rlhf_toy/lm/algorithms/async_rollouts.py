"""Rollouts beside updates (`--async_rollouts`): a forked process samples and scores the next batch with the
weights of the step before while this process runs the update, so both cores work (PipelineRL, AReaL and TRL's
async GRPO do this on GPUs with vLLM; here it is the CPU's second core). One worker serves both loops: the RLHF
trainer's batches of replies and the agent trainer's batches of episodes (`Sampled` is what it needs of either).

The protocol is a strict pipeline, so a run is as reproducible as a synchronous one. Step k (policy version k-1
before its update, k after):

    staleness 1:  receive batch k (sampled with version k-2) -> hand over version k-1 -> request batch k+1 -> update
    staleness 0:  hand over version k-1 -> request batch k -> receive it -> update      (no overlap: a check)

The sampler's weights live in shared memory and are written only while it is idle (between a reply and the next
request), so a handover is one copy of the trained parameters and never races the sampler. Each request carries the
sampling RNG states (torch's global generator and the trainer's own: the prompt generator, the agent's reset seeds)
and each reply returns them advanced, so the states live in this process as in a synchronous run: with staleness 0
every number equals the synchronous run's bit for bit (tested), and a checkpoint is exact: it first receives the
batch in flight and saves it (`pending`), so a resumed run consumes the same batch the uninterrupted one did.

The sampler runs on one torch thread: a forked process cannot start a second OpenMP pool once the parent has used
one (GNU OpenMP hangs), and sampling is the lighter phase. The update keeps the rest of the threads (at least one).
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import pickle
import traceback
from dataclasses import replace
from typing import Any, NoReturn, Protocol

import torch

from rlhf_toy.errors import UserError, note_once


class Sampled(Protocol):
    """What the worker reads and calls of a trainer (`rlhf.RLHFTrainer`, `agents.trainer.AgentTrainer`)."""

    policy: Any
    step_count: int

    def sample_ahead(self, beta: float, version: int) -> Any:
        """The batch of the next step, sampled with the current weights (`version`: the updates before them), and
        what came with it, picklable; drawn from the sampling RNG states."""
        ...

    def sampling_states(self) -> Any:
        """The RNG states sampling draws from (torch's global generator and the trainer's own)."""
        ...

    def set_sampling_states(self, states: Any) -> None: ...


def on_cpu(cfg: Any, device: torch.device) -> Any:
    """`cfg` as it runs on `device`: the sampler is a second CPU process, so elsewhere a run samples synchronously
    (said once, and `cfg` says what runs)."""
    if not cfg.async_rollouts or device.type == "cpu":
        return cfg
    note_once(
        f"--async_rollouts samples in a second CPU process; this run is on {device.type}, so it samples synchronously"
    )
    return replace(cfg, async_rollouts=False)


def serve(trainer: Sampled, sampler: torch.nn.Module, conn, parent_end) -> None:
    """The sampling process: `trainer` (forked) with `sampler` (shared memory) as its policy answers each request
    `(step_count, policy version, beta, rng states)` with `("ok", the batch, rng states after it)`, or
    `("error", exception, traceback)`; None or EOF ends it."""
    parent_end.close()  # so that the parent's death reads as EOF here
    torch.set_num_threads(1)
    trainer.policy = sampler
    while True:
        try:
            request = pickle.loads(conn.recv_bytes())
        except EOFError:
            return
        if request is None:
            return
        trainer.step_count, version, beta, states = request  # step_count: errors name the step that consumes it
        trainer.set_sampling_states(states)
        try:
            reply: Any = ("ok", trainer.sample_ahead(beta, version), trainer.sampling_states())
        except BaseException as exc:  # sent back whole: the parent raises it where a synchronous run would
            reply = ("error", exc, traceback.format_exc())
        try:
            payload = pickle.dumps(reply)
        except Exception:  # an exception that does not pickle: its text
            payload = pickle.dumps(("error", RuntimeError(f"{reply[1]!r}"), reply[-1]))
        try:
            conn.send_bytes(payload)
        except BrokenPipeError:  # the parent died while this batch was sampled
            return


class RolloutWorker:
    """The sampling process of one trainer and the pipeline's state (the batch in flight or received)."""

    def __init__(self, trainer: Sampled, staleness: int, pending: Any = None) -> None:
        self.staleness = staleness
        # The sampler's own copy, in shared memory: the handover writes the trained parameters into it.
        self.sampler = copy.deepcopy(trainer.policy).share_memory()
        sampled = dict(self.sampler.named_parameters())
        self.trained = [(p, sampled[n]) for n, p in trainer.policy.named_parameters() if p.requires_grad]
        self.threads = torch.get_num_threads()  # given back by `close`
        torch.set_num_threads(max(1, self.threads - 1))  # the sampler takes one core
        ctx = mp.get_context("fork")  # the trainer (models, reward, judge) as it is, nothing pickled
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=serve, args=(trainer, self.sampler, child, self.conn), daemon=True, name="rlhf-toy-sampler"
        )
        self.process.start()
        child.close()
        self.in_flight = False
        self.pending = pending

    def hand_over(self, trainer: Sampled) -> None:
        """The current weights into the idle sampler's shared memory."""
        with torch.no_grad():
            for p, q in self.trained:
                q.copy_(p)

    def request(self, trainer: Sampled, beta: float) -> None:
        """Hand over the current policy and ask for the batch of step `step_count + 1 + staleness`."""
        self.hand_over(trainer)
        request = (trainer.step_count + self.staleness, trainer.step_count, beta, trainer.sampling_states())
        try:
            self.conn.send_bytes(pickle.dumps(request))
        except OSError:  # a broken pipe: the sampler is gone
            self.died()
        self.in_flight = True

    def receive(self, trainer: Sampled) -> None:
        """Wait for the batch in flight; keep it as `pending` and take its RNG states."""
        try:
            reply = pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            self.died()
        self.in_flight = False
        if reply[0] == "error":
            exc, where = reply[1], reply[2]
            if isinstance(exc, UserError):
                raise exc
            raise RuntimeError(f"the sampling process failed:\n{where}") from exc
        self.pending = reply[1]
        trainer.set_sampling_states(reply[2])

    def died(self) -> NoReturn:
        self.in_flight = False
        self.process.join(5)
        raise UserError(
            f"the sampling process of --async_rollouts died (exit code {self.process.exitcode}; out of memory?); "
            "resume with --resume, or run without --async_rollouts"
        ) from None

    def next(self, trainer: Sampled, beta: float) -> Any:
        """This step's batch (as `sample_ahead` returned it); with staleness 1 the next one is on its way."""
        if self.pending is None:
            if not self.in_flight:
                self.request(trainer, beta)
            self.receive(trainer)
        batch, self.pending = self.pending, None
        if self.staleness:  # even after the last step: a run resumed for more steps goes on exactly as a longer one
            self.request(trainer, beta)  # sampled with this update's starting weights while it runs
        return batch

    def settle(self, trainer: Sampled) -> Any:
        """The batch in flight, received (a checkpoint saves it so a resumed run consumes the same batch)."""
        if self.in_flight:
            self.receive(trainer)
        return self.pending

    def close(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
        self.process.join(10)
        self.conn.close()
        torch.set_num_threads(self.threads)


class AsyncSampling:
    """A trainer's `--async_rollouts` state: its sampling process (forked by the first batch asked of it, stopped by
    `close`) and the batch sampled ahead that a checkpoint or a stopped process left, which the next process starts
    with (a resumed run consumes the batch the uninterrupted one did)."""

    def __init__(self) -> None:
        self.worker: RolloutWorker | None = None
        self.resumed: Any = None

    def next(self, trainer: Sampled, staleness: int, beta: float) -> Any:
        """This step's batch, from the sampling process (started here on the first call)."""
        # The sampler forks outside any autocast context (a forked child would never leave one, and would keep its
        # first weights' bf16 copies for good); the trainer's `sample_ahead` autocasts there as in a synchronous step.
        if self.worker is None:
            self.worker, self.resumed = RolloutWorker(trainer, staleness, self.resumed), None
        return self.worker.next(trainer, beta)

    def pending(self, trainer: Sampled) -> Any:
        """The batch sampled ahead (received first if in flight: it advances the sampling RNG states), or None."""
        return self.worker.settle(trainer) if self.worker is not None else self.resumed

    def close(self) -> None:
        """Stop the sampling process, if any. A batch in flight is dropped: stepping on samples it afresh (a
        checkpoint, `pending`, receives it first and is exact)."""
        if self.worker is not None:
            self.resumed = self.worker.pending
            self.worker.close()
            self.worker = None
