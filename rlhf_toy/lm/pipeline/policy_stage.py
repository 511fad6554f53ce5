"""Stage 5, the online policy stage: one run of any algorithm of the table (`online.ALGORITHMS`) in its own
directory (run_dir/ALGORITHM by default), with checkpoints, exact resume, a metrics log, the report page and a
held-out evaluation every few steps.

`stage_policy` is the whole stage; `PolicyRun` holds what one run needs between steps (the trainer, its logs,
where it writes) so that each part is a named method: `start`, `step`, `checkpoint`, `report`, `finish`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from rlhf_toy.config import check, derived, option
from rlhf_toy.distributed import barrier, is_main, rank_and_world
from rlhf_toy.errors import UserError, note_once
from rlhf_toy.io import folder_digest
from rlhf_toy.logging import MetricLogger, plt_module, save_figure, trackers
from rlhf_toy.ppo import PPOConfig
from rlhf_toy.report.page import write_report

from ..algorithms.online import get_algorithm
from ..algorithms.rlhf import RLHFConfig, RLHFTrainer
from ..data.tasks import Task
from ..models.lora import LoraConfig, lora_settings
from .evaluate import greedy_accuracy
from .run import RunConfig
from .rundir import PolicyDir, RunDir
from .stages import reference_model, reward_kind, start_policy, task_reward


@dataclass
class OutputConfig:
    """Where a policy run's output goes, how it is reported, and whether it resumes from its last checkpoint."""

    resume: bool = option("Continue from the policy directory's last checkpoint.", False)
    policy_dir: str | None = option(
        "Output directory: a path, or a bare name for run_dir/NAME (default: run_dir/ALGORITHM, e.g. run_dir/ppo).",
        None,
    )
    report_every: int = option(
        "Rebuild the run's report.html (curves, samples, alarms) every this many steps while it trains, and "
        "keep the step's sampled replies for it (0: only at the end).",
        25,
    )
    report_to: str = option(
        "Trackers besides metrics.jsonl: tensorboard, trackio (comma-separated), all or none (as transformers' "
        "report_to).",
        "tensorboard",
    )

    trackers: tuple[str, ...] = derived()

    def __post_init__(self) -> None:
        check(self.report_every >= 0, "report_every", self.report_every, ">= 0 (0: only at the end)")
        self.trackers = trackers(self.report_to)  # an unknown or missing tracker: one line now


def plot_policy_curves(rows: list[dict[str, Any]], path) -> None:
    plt = plt_module()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    steps = [r["step"] for r in rows]
    axes[0].plot(steps, [r["objective/score"] for r in rows], label="reward model")
    if "objective/gold" in rows[0]:
        axes[0].plot(steps, [r["objective/gold"] for r in rows], label="gold")
    axes[0].set(xlabel="step", title="score")
    axes[0].legend(fontsize=8)
    axes[1].plot(steps, [r["objective/kl"] for r in rows])
    axes[1].set(xlabel="step", title="KL to reference (nats)")
    axes[2].plot(steps, [r["policy/response_length"] for r in rows])
    axes[2].set(xlabel="step", title="response length (tokens)")
    save_figure(fig, path)


# What --resume may change: how long to train and how often to save. Anything else must match the saved run.
RESUMABLE_CHANGES = {"steps", "save_every", "eval_every", "eval_prompts"}  # the held-out curve changes no step


def run_settings(run: RunConfig, cfg: RLHFConfig, ppo: PPOConfig) -> dict[str, Any]:
    """Every setting that shapes a policy run's steps, flat, as saved in its checkpoint."""
    keys = ("task", "data", "judge", "seed", "max_train_pairs", "reward_fn", "reward_weights")
    # how the reward model's scores become the reward (the model itself is checked by content: model_identity)
    keys += ("reward_objective", "uncertainty_coef", "length_penalty")
    data = {k: getattr(run, k) for k in keys}
    if run.checkable_task:  # its problems
        data.update(asdict(run.checkable))
    return {**data, **asdict(cfg), **ppo.to_dict()}


def command_defaults(algorithm: str) -> dict[str, Any]:
    """The settings an algorithm's command runs with when no flag is given (its record's `configs()`): what a
    report compares a run's settings with."""
    return run_settings(RunConfig(), *get_algorithm(algorithm).configs())


def check_resume_settings(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse a resume whose settings differ from the saved run's (naming each): the record must say what ran."""
    diff = [
        f"--{k} {current[k]!r} (saved: {saved[k]!r})"
        for k in current
        if k in saved and k not in RESUMABLE_CHANGES and saved[k] != current[k]
    ]
    if diff:
        raise UserError(
            f"--resume with settings that differ from the saved run: {', '.join(diff)}; pass the saved "
            "values (only --steps, --save_every and the held-out evaluation's settings may change) or start a new "
            "--policy_dir"
        )


def model_identity(rd: RunDir, reward_model: bool = True) -> dict[str, str]:
    """What a policy run trains against, by content: the SFT model (the starting policy and the reference) and
    the reward model (unless the reward is a program). Saved in every checkpoint; `--resume` refuses to continue
    against other models."""
    identity = {"sft": folder_digest(rd.sft)}
    if reward_model:
        identity["reward_model"] = folder_digest(rd.reward_model)
    return identity


def check_resume_identity(saved: dict[str, str] | None, current: dict[str, str], rd: RunDir) -> None:
    changed = [name for name, digest in current.items() if saved is not None and saved.get(name) != digest]
    if changed:
        where = ", ".join(str(rd.path / name) for name in changed)
        raise UserError(
            f"--resume against other models than the saved run's: {where} changed since it started (a stage was "
            "re-run); resume with the models it trained against, or start a new --policy_dir"
        )


class PolicyRun:
    """One policy run in its directory, between `start` (the models, the trainer, a resumed state, the logs) and
    `finish` (the policy, the summary). Call inside the directory's lock and the run's read lock."""

    def __init__(
        self, run: RunConfig, task: Task, cfg: RLHFConfig, ppo: PPOConfig, where: OutputConfig, lora: LoraConfig,
        algorithm: str, out: PolicyDir,
    ) -> None:  # fmt: skip
        self.run, self.task, self.cfg, self.ppo, self.where, self.lora = run, task, cfg, ppo, where, lora
        self.algorithm, self.out, self.rd = algorithm, out, run.dir
        self.settings = {**run_settings(run, cfg, ppo), **asdict(lora), "algorithm": algorithm}

    def start(self, device: torch.device) -> None:
        """Load the policy (fresh, or the checkpoint to resume), the reference and the reward; build the trainer and
        open the logs, a resumed run keeping exactly its history up to its checkpoint's step."""
        rd, out, lora = self.rd, self.out, self.lora
        out.check_kind(self.algorithm)
        self.identity = model_identity(rd, reward_model=self.task.reward is None)
        state = None
        if self.where.resume:
            model, tok, state = out.load_checkpoint(lambda: rd.load_sft(device) if lora.enabled else None)
            check_resume_identity(state.get("models"), self.identity, rd)
            check_resume_settings(state.get("settings", {}), self.settings)
        else:
            model, tok = start_policy(rd, device, lora)
        reward = task_reward(self.run, self.task, tok, device, self.cfg.reward_reads)
        self.trainer = RLHFTrainer(
            model, reward, tok, self.cfg, self.ppo, self.task.train_prompts, self.run.seed, judge=self.task.judge,
            ref_model=reference_model(rd, device, lora), algorithm=self.algorithm,
        )  # fmt: skip
        if state is not None:
            self.trainer.load_state(state)
        resumed = state is not None
        self.rows = out.load_metrics(upto=self.trainer.step_count) if resumed else []
        kind = reward_kind(self.run, self.task)
        if kind != "program" and self.cfg.kl_coef == 0 and not self.cfg.adaptive_kl and self.cfg.kl_limit is None:
            # measured: dapo's defaults against the toy reward model peak at step 22, then KL reaches 220 nats
            note_once(
                f"{self.algorithm} runs with no KL penalty against a learned reward ({kind}): nothing holds the "
                "policy near the reference, and it is likely to over-optimize; pass --kl_coef 0.05 (a checker's "
                "reward needs none)"
            )
        rd.save_json(
            out.path / "settings.json",
            {
                "settings": self.settings,
                "preset": command_defaults(self.algorithm),
                "reward_kind": kind,  # the report's alarms word their texts by it
            },
        )
        config = {"settings": self.settings, "run_dir": str(rd.path)}
        self.logger = MetricLogger(out.path, self.where.trackers, self.rows, enabled=is_main(), config=config)
        kept = out.load_samples(upto=self.trainer.step_count) if resumed else []
        self.samples_log = MetricLogger(out.path, (), kept, enabled=is_main(), filename=out.sample_log.name)
        self.reported = kept[-1]["step"] if kept else 0
        self.held_out = self.task.eval_prompts[: self.cfg.eval_prompts]
        self.initial = self.evaluate() if self.cfg.eval_every and not resumed else None
        self.train_s = sum(r["time/step_s"] for r in self.rows)

    def evaluate(self) -> float:
        """Held-out greedy gold (a checkable task's accuracy): greedy draws no random numbers, so the run is the
        same without it."""
        t = self.trainer
        return float(np.mean(greedy_accuracy(t.policy.lm, t.tok, self.task, self.held_out, self.cfg.max_new_tokens)))

    def step(self) -> dict[str, Any]:
        """One training step, logged with its training time so far (and the held-out figure when due)."""
        m = self.trainer.step()
        self.train_s += m["time/step_s"]
        m["time/train_s"] = self.train_s  # training only: the held-out evaluations are not counted
        if self.cfg.eval_every and self.trainer.step_count % self.cfg.eval_every == 0:
            m["eval/greedy_gold"] = self.evaluate()
        self.logger.log(m["step"], m)
        self.rows.append(m)
        return m

    def checkpoint(self) -> None:
        """The trainer's state beside the policy; a collective call (it gathers the ranks' RNG states)."""
        state = self.trainer.state()
        self.logger.flush()  # first the history, so a kill right after the checkpoint leaves no hole in it
        self.samples_log.flush()
        extra = {"settings": self.settings, "models": self.identity}
        self.out.save_checkpoint(self.trainer.policy.lm, self.trainer.tok, {**state, **extra})
        barrier()

    def report(self) -> None:
        """The step's replies into samples.jsonl (once per step), and report.html rebuilt from the files."""
        if self.trainer.last_samples and self.trainer.step_count > self.reported:
            self.samples_log.log(self.trainer.step_count, {"samples": self.trainer.last_samples})
            self.reported = self.trainer.step_count
        if is_main():
            self.logger.flush()
            self.samples_log.flush()
            write_report([self.out.path])

    def close(self) -> None:
        self.trainer.close()  # the sampling process of --async_rollouts
        self.logger.close()
        self.samples_log.close()

    def finish(self, wall_s: float) -> dict[str, Any]:
        """Save the policy, its last replies and curves; the run's summary (also `summary.json`)."""
        t, out, rows = self.trainer, self.out, self.rows
        out.save_policy(t.policy.lm, t.tok)
        self.rd.save_json(out.samples, t.last_samples)
        if rows and is_main():
            plot_policy_curves(rows, out.curves)
        last = rows[-1] if rows else {}
        step_s = sum(r["time/step_s"] for r in rows)
        world = rank_and_world()[1]
        summary = {
            "stage": "policy",
            "algorithm": self.algorithm,
            "steps": t.step_count,
            "wall_s": wall_s,
            "stopped_by_kl_limit": t.stopped_by_kl_limit,
            "final_score": last.get("objective/score"),
            "final_gold": last.get("objective/gold"),
            "final_kl": last.get("objective/kl"),
            "final_beta": last.get("objective/beta"),
            "initial_greedy_gold": self.initial,
            "final_greedy_gold": last.get("eval/greedy_gold"),
            "world_size": world,  # episodes: all ranks' (batch_size is per rank)
            "episodes_per_s": self.cfg.batch_size * world * len(rows) / max(1e-9, step_s),
            "config": asdict(self.cfg),
            "ppo": self.ppo.to_dict(),
        }
        self.rd.save_json(out.summary, summary)
        return summary


def stage_policy(
    run: RunConfig,
    cfg: RLHFConfig | None,
    ppo: PPOConfig | None,
    where: OutputConfig,
    lora: LoraConfig | None = None,
    algorithm: str = "ppo",
) -> dict[str, Any]:
    """An online RLHF run of one algorithm of `online.ALGORITHMS`, with the record's settings under what `cfg` and
    `ppo` give (`OnlineAlgorithm.settle`; None: the record's own)."""
    task = run.start()
    cfg, ppo = get_algorithm(algorithm).settle(cfg, ppo)
    lora = lora_settings(lora)
    device = run.torch_device
    out = run.dir.policy_dir(where.policy_dir or algorithm)
    policy = PolicyRun(run, task, cfg, ppo, where, lora, algorithm, out)
    with out.lock(), run.dir.reading():
        policy.start(device)
        t0 = time.perf_counter()
        trainer = policy.trainer
        visible = run.progress and is_main()
        bar = tqdm(total=cfg.steps, initial=trainer.step_count, desc=algorithm, disable=not visible, leave=False)
        try:
            while trainer.step_count < cfg.steps and not trainer.stopped_by_kl_limit:
                m = policy.step()
                bar.update(1)
                gold = {"gold": f"{m['objective/gold']:.2f}"} if "objective/gold" in m else {}  # none: no judge
                postfix = {"score": f"{m['objective/score']:.2f}", **gold, "kl": f"{m['objective/kl']:.2f}"}
                bar.set_postfix(postfix, refresh=False)
                if trainer.step_count == 1 or (where.report_every and trainer.step_count % where.report_every == 0):
                    policy.report()
                if cfg.save_every and trainer.step_count % cfg.save_every == 0:
                    policy.checkpoint()
            policy.report()  # the last step's replies, unless just reported, and the report at the end
            policy.checkpoint()
        finally:
            bar.close()
            policy.close()
        summary = policy.finish(time.perf_counter() - t0)
    barrier()
    return summary
