"""Every RLHF method on the gold-vs-KL frontier: `rlhf-toy compare`.

From one run's SFT model and reward model (stages 1-4), each method trains over several seeds at a matched
budget (the same number of sampled episodes for every online method; DPO reads the preference pairs), then each
policy is evaluated on the held-out prompts (gold, reward-model score, KL to the reference, on-topic rate,
distinct-2, words) beside best-of-n from the SFT model, with Gao et al.'s fits (`frontier.py`; on a checkable
task, accuracy against episodes: `reasoning.py`). Outputs: run_dir/compare.md, compare.json, compare.png,
compare_report.html (every run's curves and alarms; `--name` picks another stem).

Remedies against over-optimization (`--remedies`, the records of `remedies.py`: reward-model ensembles under
three objectives, WARM, a length penalty, the KL as a loss term) make each online method one variant per remedy
(`ppo_ensemble_worst`), and rank best-of-n by each remedy's reward. Several betas (`--kl_coef 0,0.03,0.1`)
make each online method one variant per beta (`ppo_beta0.03`): with `--methods ppo --seeds 0` that is the
lesson's over-optimization warning (PPO at several KL coefficients against best-of-n, proxy and gold against
sqrt(KL); Gao et al. 2022), which was the `overopt` command before 0.2.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlhf_toy.config import check, check_seed, derived, option, parse_list, parse_names
from rlhf_toy.distributed import is_main
from rlhf_toy.logging import read_jsonl
from rlhf_toy.report.page import write_report

from ..algorithms.dpo import DPOConfig
from ..algorithms.online import ALGORITHMS, OFFLINE_LABELS
from ..algorithms.rlhf import RLHFConfig
from .evaluate import (
    best_of_n_rows,
    best_of_n_texts,
    evaluate_policy,
)
from .frontier import plot_frontier, summarize
from .policy_stage import OutputConfig, stage_policy
from .reasoning import plot_accuracy, summarize_checkable
from .remedies import REMEDIES, Remedy, RewardCache, prepare_reward_models
from .run import RunConfig, writes_run_dir
from .stages import DPODirConfig, stage_dpo

METHODS = (*ALGORITHMS, *OFFLINE_LABELS)  # every online algorithm of the table, then DPO
LARGEST_GROUP = max(a.default_group_size for a in ALGORITHMS.values())  # a batch must hold whole groups of it


@dataclass
class CompareConfig:
    methods: str = option(
        f"Comma-separated methods: {', '.join(METHODS)} (the online algorithms' table and DPO).", ",".join(METHODS)
    )
    seeds: str = option("Comma-separated seeds of the RL runs (the SFT and reward models are the run's).", "0,1,2")
    episodes: int = option("Sampled episodes per online run (steps = episodes / batch_size).", 6400)
    batch_size: int = option(
        "Episodes per step for every online method (grouped ones: batch_size / k prompts, k replies each).", 64
    )
    eval_prompts: int = option("Held-out prompts for every evaluation.", 200)
    best_of: str = option("n of the best-of-n frontier.", "1,2,4,8,16,32,64")
    kl_coef: str = option(
        "beta of every online method's KL penalty; several, comma-separated, run each online method "
        "once per beta (empty: RLHFConfig's 0.1).",
        "",
    )
    minibatch_size: int | None = option(
        "Sequences per gradient step of every online method (None: each preset's, at most batch_size).", None
    )
    learning_rate: float | None = option("Learning rate of every online method (None: each preset's).", None)
    max_new_tokens: int | None = option("Longest reply of every method and evaluation (None: RLHFConfig's).", None)
    eval_every: int = option(
        "Checkable tasks: held-out greedy accuracy every this many steps of each online run (its curve against "
        "episodes and wall time; 0: only at the end).",
        10,
    )
    async_rollouts: bool | None = option(
        "Every online run samples its next batch beside its update (True) or not (False); None: as each "
        "algorithm's record does (GRPO's beside it, the others' not).",
        None,
    )
    remedies: str = option(
        "Comma-separated remedies against reward over-optimization, each online method run under each: "
        f"{', '.join(REMEDIES)} (none: the run's reward model alone). The ensemble and WARM reward models are "
        "trained once, when missing, into run_dir/reward_ensemble and run_dir/reward_warm; remedies on the "
        "reward side also rank best-of-n.",
        "none",
    )
    name: str = option(
        "Name of this comparison: its outputs are run_dir/NAME.md, .json, .png and its runs "
        "run_dir/NAME_METHOD_sSEED (another name keeps an earlier comparison).",
        "compare",
    )
    method_list: list[str] = derived()
    seed_list: list[int] = derived()
    best_of_ns: list[int] = derived()
    betas: list[float | None] = derived()
    remedy_list: list[str] = derived()

    def __post_init__(self) -> None:
        self.method_list = parse_names("methods", self.methods, METHODS)
        self.seed_list = parse_list("seeds", self.seeds, int, "comma-separated integers")
        for seed in self.seed_list:
            check_seed(seed, "seeds")
        # Two runs of one seed are the same run: a standard error over them would claim a precision it lacks.
        check(len(set(self.seed_list)) == len(self.seed_list), "seeds", self.seeds, "distinct seeds, e.g. 0,1,2")
        self.best_of_ns = parse_list("best_of", self.best_of, int, "integers >= 1")
        check(all(n >= 1 for n in self.best_of_ns), "best_of", self.best_of, "comma-separated integers >= 1")
        check(
            self.batch_size % LARGEST_GROUP == 0,
            "batch_size",
            self.batch_size,
            f"a multiple of {LARGEST_GROUP} (the group size of the grouped methods)",
        )
        check(self.episodes >= self.batch_size, "episodes", self.episodes, f">= batch_size ({self.batch_size})")
        check(self.eval_prompts >= 2, "eval_prompts", self.eval_prompts, ">= 2")
        self.betas = parse_list("kl_coef", self.kl_coef, float, "numbers >= 0") if self.kl_coef.strip() else [None]
        check(all(b is None or b >= 0 for b in self.betas), "kl_coef", self.kl_coef, "numbers >= 0, e.g. 0.1")
        self.remedy_list = parse_names("remedies", self.remedies, REMEDIES)
        check(len(set(self.remedy_list)) == len(self.remedy_list), "remedies", self.remedies, "distinct names")
        check(self.learning_rate is None or self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0")
        check(self.max_new_tokens is None or self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, ">= 1")
        check(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0 (0: only at the end)")
        check(
            self.minibatch_size is None or 1 <= self.minibatch_size <= self.batch_size,
            "minibatch_size",
            self.minibatch_size,
            f"between 1 and batch_size ({self.batch_size})",
        )
        check(
            bool(re.fullmatch(r"[A-Za-z0-9_.-]+", self.name)),
            "name",
            self.name,
            "letters, digits, '_', '-' or '.' (it names files in the run directory)",
        )


@dataclass(frozen=True)
class Variant:
    """One run of each seed: a method at a beta under a remedy."""

    name: str
    method: str
    beta: float | None
    remedy: Remedy


def variants(cfg: CompareConfig) -> list[Variant]:
    """Every run of a seed: each online method once per beta and remedy (named METHOD, with _betaB when there are
    several betas and _REMEDY when there is a remedy), DPO once (it has no KL penalty to the reference's samples
    and learns from the pairs, not from a reward model)."""
    out = []
    remedies = [REMEDIES[r] for r in cfg.remedy_list]
    for method in cfg.method_list:
        if method not in ALGORITHMS:
            out.append(Variant(method, method, None, REMEDIES["none"]))
            continue
        for b in cfg.betas:
            for remedy in remedies:
                name = method + (f"_beta{b:g}" if len(cfg.betas) > 1 else "")
                name += "" if remedy.name == "none" else f"_{remedy.name}"
                out.append(Variant(name, method, b, remedy))
    return out


def online_settings(
    method: str, beta: float | None, cfg: CompareConfig, checkable: bool = False, rl: dict[str, Any] | None = None
) -> tuple[RLHFConfig, Any]:
    """The matched budget for one online run: the method's own preset and group size, `cfg`'s batch and beta (and
    on a checkable task, the held-out accuracy every `eval_every` steps), then a remedy's `rl` settings."""
    algorithm = ALGORITHMS[method]
    kl = {} if beta is None else {"kl_coef": beta}
    tokens = {} if cfg.max_new_tokens is None else {"max_new_tokens": cfg.max_new_tokens}
    steps = cfg.episodes // cfg.batch_size
    evals = {"eval_every": cfg.eval_every or steps, "eval_prompts": cfg.eval_prompts} if checkable else {}
    lr = {} if cfg.learning_rate is None else {"learning_rate": cfg.learning_rate}
    # a batch smaller than the preset's minibatch is one minibatch
    minibatch = cfg.minibatch_size or min(algorithm.preset.minibatch_size, cfg.batch_size)
    budget = {"steps": steps, "batch_size": cfg.batch_size, "save_every": 0, "minibatch_size": minibatch}
    if cfg.async_rollouts is not None:
        budget["async_rollouts"] = cfg.async_rollouts
    return algorithm.configs(**budget, **kl, **tokens, **evals, **lr, **(rl or {}))


@writes_run_dir
def run_comparison(run: RunConfig, cfg: CompareConfig) -> dict[str, Any]:
    task = run.start()
    rd = run.dir
    device = run.torch_device
    runs = variants(cfg)
    if task.reward is not None and any(v.method not in ALGORITHMS for v in runs):
        dropped = sorted({v.method for v in runs if v.method not in ALGORITHMS})
        print(f"note: {', '.join(dropped)} left out: a program reward gives no preference pairs to learn from")
        runs = [v for v in runs if v.method in ALGORITHMS]
    remedies = [REMEDIES[r] for r in cfg.remedy_list]
    prepare_reward_models(run, remedies)
    sft, tok = rd.load_sft(device)
    rewards = RewardCache(run, task, tok, device)
    rm = rewards.of(REMEDIES["none"])
    prompts = task.eval_prompts[: cfg.eval_prompts]
    sampling = RLHFConfig()  # every evaluation samples as the online methods do by default
    temperature, tokens = sampling.temperature, cfg.max_new_tokens or sampling.max_new_tokens
    sft_row = evaluate_policy("SFT", sft, sft, rm, tok, task, prompts, temperature, tokens, run.seed)
    bon: dict[str, list[dict[str, Any]]] = {}
    if not task.checkable:  # best-of-n ranked by each remedy's reward (one sample of n replies for all)
        texts = best_of_n_texts(sft, tok, prompts, max(cfg.best_of_ns), temperature, tokens, run.seed)
        for remedy in [r for r in remedies if r.ranks_best_of_n] or [REMEDIES["none"]]:
            label = "" if remedy.name == "none" else f" ({remedy.label})"
            scores = rewards.score_texts(remedy, [p for p in prompts for _ in range(max(cfg.best_of_ns))], texts)
            bon[remedy.name] = best_of_n_rows(task, prompts, texts, scores, cfg.best_of_ns, label)
    results: dict[str, list[dict[str, Any]]] = {v.name: [] for v in runs}
    policy_dirs: list[Path] = []  # every online run, for the comparison's report page
    curves: dict[str, list[list[dict[str, Any]]]] = {v.name: [] for v in runs}
    for seed in cfg.seed_list:
        for v in runs:
            seeded = v.remedy.run_config(replace(run, seed=seed))
            name = f"{cfg.name}_{v.name}_s{seed}"
            t0 = time.perf_counter()
            if v.method in ALGORITHMS:
                rl, preset = online_settings(v.method, v.beta, cfg, task.checkable, v.remedy.rl)
                summary = stage_policy(seeded, rl, preset, OutputConfig(policy_dir=name), None, v.method)
                curves[v.name].append(read_jsonl(rd.policy_dir(name).metrics))
                policy_dirs.append(rd.policy_dir(name).path)
            else:
                summary = stage_dpo(seeded, DPOConfig(), DPODirConfig(name))
            wall = time.perf_counter() - t0
            policy, _ = rd.policy_dir(name).load_policy(name)
            row = evaluate_policy(
                v.name, policy.to(device), sft, rewards.of(v.remedy), tok, task, prompts, temperature, tokens, seed
            )
            row.update(seed=seed, wall_s=wall, episodes_per_s=summary.get("episodes_per_s"))
            results[v.name].append(row)
    if task.checkable:
        report = summarize_checkable(sft_row, results, curves, cfg.batch_size)
    else:
        report = summarize(sft_row, bon, results, curves)
    report["settings"] = {
        "episodes": cfg.episodes,
        "batch_size": cfg.batch_size,
        "kl_coef": cfg.betas if len(cfg.betas) > 1 else cfg.betas[0],
        "minibatch_size": cfg.minibatch_size,
        "async_rollouts": cfg.async_rollouts,
        "seeds": cfg.seed_list,
        "remedies": {r.name: r.summary for r in remedies},
        "uncertainty_coef": run.uncertainty_coef,
    }
    rd.save_json(rd.report(f"{cfg.name}.json"), report)
    rd.save_text(rd.report(f"{cfg.name}.md"), report["table"])
    if policy_dirs and is_main():  # every run's curves overlaid, with each one's alarms
        write_report(policy_dirs, rd.report(f"{cfg.name}_report.html"))
    if task.checkable:
        plot_accuracy(report, rd.report(f"{cfg.name}.png"))
    else:
        plot_frontier(report, curves, rd.report(f"{cfg.name}.png"))
    print(report["table"])
    return report
