"""`rlhf-toy agent --env frozenlake --algorithm ppo`: demonstrations, a tokenizer, SFT, RL in the environment, and
an evaluation on held-out starting states beside the random, scripted and (where computable) optimal policies.

The run directory: `agent.json` (settings, then the figures), `metrics.jsonl` (one row per RL step: the report
reads it), `sft_model/` and `model/` (each with its tokenizer: `rlhf-toy sample` chats with them), `eval.md` and
`eval.json`. The flags are the algorithm's record and the environment's settings (`agent_command`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlhf_toy.cli import Command
from rlhf_toy.config import check, check_seed, option
from rlhf_toy.errors import UserError
from rlhf_toy.io import atomic_write_json, atomic_write_text, output_lock, read_json
from rlhf_toy.logging import MetricLogger, markdown_table
from rlhf_toy.report.page import write_report
from rlhf_toy.seeding import seed_everything

from ..algorithms.online import get_algorithm, label
from ..algorithms.rlhf_config import RLHFConfig
from ..algorithms.sft import PRETRAINED_LEARNING_RATE, SFTConfig, train_sft
from ..models.base import context_length, load_base, resolve_base_model
from ..models.causal_lm import ModelConfig, new_causal_lm
from ..models.chat import train_tokenizer
from ..models.checkpoints import load_causal_lm, save_model
from ..models.lora import LoraConfig, add_lora
from ..pipeline.policy_stage import check_resume_settings
from ..pipeline.run import quiet_libraries
from ..pipeline.rundir import PolicyDir
from .registry import DEMONSTRATORS, EnvRecord, get_env
from .rollout import NoDemonstrator, demo_pairs, demonstrate, env_tools
from .trainer import (
    AGENT_ROLLOUT,
    AGENT_UNREAD,
    AgentConfig,
    AgentTrainer,
    action_words,
    agent_settings,
    constrains,
    eval_seeds,
    held_out,
)


@dataclass
class AgentRunConfig:
    """Where the run goes and how the tiny model starts."""

    run_dir: str = option("Directory of the agent run.", "runs/agent")
    seed: int = option("Seed of everything (demonstrations, model, episodes).", 0)
    threads: int = option("torch threads.", 1)
    demos: int = option("Demonstration episodes for SFT (a tenth held out for its loss).", 200)
    demonstrator: str | None = option(
        "Whose episodes the SFT imitates: random (draws from the environment's actions), scripted (its good policy), "
        "walker (FrozenLake: the shortest way as if the lake did not slip, a random move half the time) or "
        "half-tool (the calculator's); None: the environment's own.",
        None,
    )
    sft_epochs: int = option("SFT epochs on the demonstrations (0: none).", 3)
    sft_batch_size: int = option(
        "SFT sequences (turns; whole episodes where the history is kept) per gradient step. Fewer take more steps, "
        "which a fresh tiny model needs to learn to read the state (measured: imitating 20 episodes of the slippery "
        "lake's optimal policy, its move was the likeliest in 11 of 11 states at 8, in 7 at 64).",
        SFTConfig.batch_size,
    )
    sft_learning_rate: float | None = option(
        "Peak learning rate of that SFT (None: 2e-3 for the fresh tiny model, 5e-5 for a --base_model's full weights).",
        None,
    )
    eval_episodes: int = option("Held-out episodes of the final evaluation (greedy).", 100)
    n_positions: int = option("The tiny model's context in tokens.", 256)
    vocab_size: int = option("The tiny model's tokenizer vocabulary.", 300)
    base_model: str | None = option(
        "A Hugging Face causal LM directory, a .gguf file, or smollm2, in its own chat template (None: a fresh tiny "
        "GPT-2 and a tokenizer trained on the demonstrations).",
        None,
    )
    resume: bool = option(
        "Continue from the run directory's last checkpoint (every --save_every steps) with the same settings: the "
        "same numbers as the run that was not stopped.",
        False,
    )

    def __post_init__(self) -> None:
        check_seed(self.seed)
        for name in ("threads", "demos", "sft_batch_size", "eval_episodes", "n_positions", "vocab_size"):
            check(getattr(self, name) >= 1, name, getattr(self, name), ">= 1")
        check(self.sft_epochs >= 0, "sft_epochs", self.sft_epochs, ">= 0")
        check(
            self.demonstrator in (None, *DEMONSTRATORS),
            "demonstrator",
            self.demonstrator,
            "one of " + ", ".join(DEMONSTRATORS),
        )
        lr = self.sft_learning_rate
        check(lr is None or lr > 0, "sft_learning_rate", lr, "> 0 (or None)")
        if self.base_model is not None:  # the tiny model's settings mean nothing for a pretrained one
            for name, default in (("n_positions", 256), ("vocab_size", 300)):
                check(getattr(self, name) == default, name, getattr(self, name), "left out with --base_model")


def agent_run_config(env: EnvRecord | str, **given: Any) -> AgentRunConfig:
    """The run settings the `agent` command uses for `env` (its record's `run` defaults) under what is given: the
    Python API's way to get what the command runs."""
    record = env if isinstance(env, EnvRecord) else get_env(env)
    return AgentRunConfig(**{**record.run, **given})


def flag_value(args: list[str], name: str, default: str) -> str:
    """The value of `--name V` or `--name=V` in `args` (the last one), else `default`."""
    value = default
    for i, a in enumerate(args):
        if a == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
    return value


def agent_command(args: list[str]) -> Command:
    """The `agent` command for these arguments: its defaults are the named algorithm's record (preset, group size,
    rollout) with the named environment's settings; what the algorithm or an agent run does not read is refused."""
    algorithm = get_algorithm(flag_value(args, "algorithm", "ppo"))
    env = flag_value(args, "env", "frozenlake")
    record = get_env(env)
    from ..pipeline.cli import COMMANDS  # the table holds the command's help (imported late: it names this module)

    task = {"max_new_tokens": record.max_new_tokens, **record.settings}  # as `agent_settings` layers them
    defaults = {
        **algorithm.defaults,
        **{k: v for k, v in task.items() if k in algorithm.reads and k not in algorithm.rollout},
    }
    return Command(
        COMMANDS["agent"].help,
        (AgentRunConfig, AgentConfig, RLHFConfig, "rlhf_toy.ppo:PPOConfig", LoraConfig),
        run_agent,
        defaults={**defaults, **record.run, **AGENT_ROLLOUT, "env": env, "algorithm": algorithm.name},
        unread={**algorithm.unread, **AGENT_UNREAD},
    )


def reference_lines(record: EnvRecord, n: int, seed: int) -> dict[str, dict[str, Any]]:
    """The random and scripted policies' figures on the evaluation's seeds, and the optimal success."""
    env, lines = record.make(), {}
    seeds = eval_seeds(n, seed)
    for who in ("random", "scripted"):
        try:
            demos = demonstrate(env, seeds, who, record.max_turns, record.name, np.random.default_rng(seed))
        except NoDemonstrator:  # a game without a scripted policy has no such line
            continue
        lines[who] = {
            "success": float(np.mean([d.success for d in demos])),
            "return": float(np.mean([d.total_return for d in demos])),
            "turns": float(np.mean([len(d.steps) for d in demos])),
        }
    if record.optimal is not None:
        lines["optimal"] = {"success": record.optimal()}
    return lines


def eval_table(rows: dict[str, dict[str, Any]]) -> str:
    head = ["policy", "success", "return", "turns", "invalid"]
    fmt = lambda r, k: "" if k not in r else f"{r[k]:.3f}"  # noqa: E731
    return markdown_table(
        head, [[name, *(fmt(r, k) for k in ("success", "return", "turns", "invalid_rate"))] for name, r in rows.items()]
    )


def start_agent(
    record: EnvRecord, run: AgentRunConfig, history: int, max_turns: int, model_config: ModelConfig | None = None
):
    """`(model, tokenizer, SFT history)`: the demonstrator's episodes (even reset seeds, as training's), a tokenizer
    trained on their text and a fresh tiny GPT-2 (`model_config`, default: `run.n_positions` of context) or the
    `--base_model` with its own, and SFT on the demonstrated turns, rendered as the agent will read them (a tenth of
    the episodes held out for the loss)."""
    env = record.make()
    instructions = getattr(env, "instructions", "")
    rng = np.random.default_rng(run.seed)
    seeds = [2 * int(s) for s in rng.integers(0, 2**30, size=run.demos)]
    demos = demonstrate(env, seeds, run.demonstrator or record.demonstrator, max_turns, record.name, rng)
    if run.base_model is not None:
        model, tok = load_base(resolve_base_model(run.base_model, Path(run.run_dir) / "base_model"))
    else:
        texts = [instructions] + [x for d in demos for step in d.steps for x in step]
        tok = train_tokenizer(texts, run.vocab_size, split_digits=True)
        model = new_causal_lm(tok, model_config or ModelConfig(n_positions=run.n_positions), seed=run.seed)
    held = max(1, run.demos // 10)
    tools = env_tools(env)
    context = context_length(model.config)
    pairs_train = demo_pairs(tok, demos[held:], instructions, history, tools, context)
    pairs_eval = demo_pairs(tok, demos[:held], instructions, history, tools, context)
    fits = lambda pairs: [x for x in pairs if len(x[0]) + len(x[1]) <= context]  # noqa: E731
    if run.sft_epochs and not fits(pairs_train):
        longest = min(len(x[0]) + len(x[1]) for x in pairs_train)
        raise UserError(
            f"environment {record.name}: no demonstrated turn fits the model's context of {context} tokens (the "
            f"shortest is {longest}); shorten the observations, keep less history (--history) or raise --n_positions"
        )
    pairs_train, pairs_eval = fits(pairs_train), fits(pairs_eval)
    sft: dict[str, Any] = {"eval_loss": [float("nan")], "wall_s": 0.0}
    if run.sft_epochs:
        default = SFTConfig().learning_rate if run.base_model is None else PRETRAINED_LEARNING_RATE
        lr = run.sft_learning_rate or default
        cfg = SFTConfig(epochs=run.sft_epochs, batch_size=run.sft_batch_size, learning_rate=lr)
        sft = train_sft(model, tok, pairs_train, pairs_eval, cfg, run.seed, False)
    return model, tok, sft


def resume_settings(run: AgentRunConfig, flat: dict[str, Any]) -> dict[str, Any]:
    """Every setting that shapes an agent run's steps, flat, as its checkpoints save them (`check_resume_settings`
    lets --steps and --save_every change)."""
    return {**{k: v for k, v in asdict(run).items() if k not in ("run_dir", "resume")}, **flat}


def start_rl(run: AgentRunConfig, agent: AgentConfig, rl: RLHFConfig, ppo, lora, record: EnvRecord, out: PolicyDir):
    """`(trainer, what the run knew before RL)`: demonstrations, SFT and the SFT model's held-out evaluation, or,
    with --resume, the checkpoint's policy and state beside the saved SFT model (the reference) and figures."""
    t0 = time.perf_counter()
    sft_model = lambda: load_causal_lm(out.path / "sft_model", "agent SFT")  # noqa: E731
    lora_on = lora is not None and lora.lora_r > 0
    if run.resume:
        model, tok, state = out.load_checkpoint(sft_model if lora_on else None)
        start = read_json(out.path / "agent.json", "start the run again without --resume")
        # the reference: the saved SFT model (a LoRA policy's is the same network with its adapters off)
        trainer = AgentTrainer(model, tok, record, agent, rl, ppo, run.seed, None if lora_on else sft_model()[0])
        check_resume_settings(state["settings"], resume_settings(run, flat_settings(trainer)))
        trainer.load_state(state)
        return trainer, start
    history = record.history if agent.history is None else agent.history
    model, tok, sft = start_agent(record, run, history, agent.max_turns or record.max_turns)
    save_model(out.path / "sft_model", model, tok)
    # RL starts from the saved SFT model, as a resumed run does: a model read back from disk and the one still in
    # memory give log-probs that differ in the last bits (measured), and a resume must replay the same numbers.
    model, tok = sft_model()
    if lora_on:  # RL trains adapters; the reference is the model without them
        model = add_lora(model, lora, "CAUSAL_LM", seed=run.seed)
    trainer = AgentTrainer(model, tok, record, agent, rl, ppo, run.seed, None if lora_on else sft_model()[0])
    settings = {
        "env": record.name,
        "algorithm": trainer.algorithm.name,
        "agent": asdict(trainer.agent),
        "run": asdict(run),
        "rl": asdict(trainer.rl),
        "ppo": trainer.ppo.to_dict(),
    }
    sft_row = trainer.evaluate(run.eval_episodes, run.seed)[0]
    start = {
        "settings": settings,
        "base": base_row(run, trainer, out) if run.base_model is not None else None,
        "sft": {"eval_loss": sft["eval_loss"][-1], "wall_s": sft["wall_s"], "row": sft_row},
        "setup_s": time.perf_counter() - t0,  # demonstrations, tokenizer, SFT and its evaluation
    }
    atomic_write_json(out.path / "agent.json", start)
    return trainer, start


def base_row(run: AgentRunConfig, trainer: AgentTrainer, out: PolicyDir) -> dict[str, Any]:
    """The `--base_model` itself (before SFT) on the held-out episodes `trainer` evaluates: what SFT and RL gained
    over it."""
    base, _ = load_base(resolve_base_model(run.base_model or "", out.path / "base_model"))  # converted once
    t = trainer
    return held_out(base, t.tok, t.record, t.settings, t.envs, run.eval_episodes, run.seed)[0]


def flat_settings(trainer: AgentTrainer) -> dict[str, Any]:
    """The report's settings table (and a checkpoint's record of what ran): one flat dict."""
    return {**asdict(trainer.agent), **asdict(trainer.rl), **trainer.ppo.to_dict()}


def run_agent(run: AgentRunConfig, agent: AgentConfig, rl: RLHFConfig, ppo, lora: LoraConfig | None = None) -> int:
    quiet_libraries()
    t0 = time.perf_counter()
    seed_everything(run.seed, run.threads)
    record = get_env(agent.env)
    out = PolicyDir(run.run_dir)
    with output_lock(out.path, "language-model agent run"):
        agent_settings(record, get_algorithm(agent.algorithm), rl, ppo)  # refused before any work, if it is
        if constrains(record, agent):
            action_words(record)  # the same
        trainer, start = start_rl(run, agent, rl, ppo, lora, record, out)
        tok, settings = trainer.tok, start["settings"]
        rows: dict[str, dict[str, Any]] = {"base model": start["base"]} if start.get("base") else {}
        rows["SFT"] = start["sft"]["row"]
        flat = flat_settings(trainer)
        # The report's settings table (flat, beside the command's defaults); an environment's reward is a program's.
        defaults = agent_command(["--algorithm", agent.algorithm, "--env", agent.env]).defaults
        atomic_write_json(out.path / "settings.json", {"settings": flat, "preset": defaults, "reward_kind": "program"})
        # 2. RL, a checkpoint every --save_every steps (the history flushed first, so that it has no hole).
        kept = out.load_metrics(upto=trainer.step_count) if run.resume else []
        logger = MetricLogger(out.path, report_to=(), history=kept)
        samples = MetricLogger(
            out.path, (), out.load_samples(upto=trainer.step_count) if run.resume else [], filename="samples.jsonl"
        )
        rl_before, t_rl = sum(r["time/step_s"] for r in kept), time.perf_counter()
        save_every, steps = trainer.rl.save_every, trainer.rl.steps
        try:
            for _ in range(trainer.step_count, steps):
                metrics = trainer.step()
                logger.log(int(metrics["step"]), metrics)
                samples.log(int(metrics["step"]), {"samples": turn_samples(trainer.last_episodes[0])})
                shown = ("step", "agent/success", "agent/return", "agent/turns", "agent/invalid")
                print(json.dumps({k: round(v, 4) for k, v in metrics.items() if k.startswith(shown)}), flush=True)
                if save_every and trainer.step_count % save_every == 0 and trainer.step_count < steps:
                    logger.flush()
                    samples.flush()
                    state = {**trainer.state(), "settings": resume_settings(run, flat)}
                    out.save_checkpoint(trainer.policy.lm, tok, state)
        finally:
            trainer.close()  # the sampling process of --async_rollouts, before the evaluation
        samples.close()
        logger.close()
        rl_s = rl_before + time.perf_counter() - t_rl
        save_model(out.path / "model", trainer.policy.lm, tok)
        # 3. Held-out evaluation beside the reference lines.
        final, episodes = trainer.evaluate(run.eval_episodes, run.seed)
        rows[label(trainer.algorithm.name)] = final
        rows.update(reference_lines(record, run.eval_episodes, run.seed))
        wall_s = time.perf_counter() - t0 + (start["setup_s"] + rl_before if run.resume else 0.0)
        figures = {
            "sft_eval_loss": start["sft"]["eval_loss"],
            "sft_s": start["sft"]["wall_s"],
            "rl_s": rl_s,
            "wall_s": wall_s,
            "eval": rows,
            "threads": run.threads,
        }
        atomic_write_json(out.path / "eval.json", {"settings": settings, **figures})
        lines = [
            f"# {record.name}: {label(trainer.algorithm.name)}, seed {run.seed}",
            "",
            f"{run.eval_episodes} held-out episodes (greedy). RL {rl_s:.0f} s, all {figures['wall_s']:.0f} s, "
            f"{run.threads} thread(s).",
            "",
            eval_table(rows),
            "",
            "A greedy episode:",
            "",
            "```",
            *example(episodes),
            "```",
            "",
        ]
        atomic_write_text(out.path / "eval.md", "\n".join(lines))
        atomic_write_json(out.path / "agent.json", {**start, **figures})
        write_report([out.path])
    print(
        json.dumps(
            {
                "stage": "agent",
                "env": record.name,
                "algorithm": trainer.algorithm.name,
                "success": final["success"],
                "return": final["return"],
                "sft_success": rows["SFT"]["success"],
                "wall_s": figures["wall_s"],
                "threads": run.threads,
            }
        )
    )
    return 0


def turn_samples(episode, limit: int = 8) -> list[dict[str, Any]]:
    """An episode's first turns as the report's table shows replies: what the agent read last, what it wrote."""
    return [
        {
            "prompt": t.observation,
            "response": t.text,
            "score": t.reward,
            "gold": None,
            "kl": None,
            "tokens": len(t.reply),
        }
        for t in episode.turns[:limit]
    ]


def example(episodes, limit: int = 12) -> list[str]:
    """The first evaluation episode's turns, as text."""
    e = episodes[0]
    lines = []
    for t in e.turns[:limit]:
        lines += [*(f"env:   {x}" for x in t.observation.splitlines()), f"agent: {t.text}   (reward {t.reward:g})"]
    return lines + [f"... {len(e.turns)} turns, return {e.total_return:g}, success {e.success}"]
