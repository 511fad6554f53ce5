"""The `label` command: its settings, the model the pairs come from, and the run (the web app is
`labeling.app`; `labeling` sits below `pipeline` and never imports it)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rlhf_toy.config import check, option
from rlhf_toy.errors import UserError

from ..labeling.session import LABELER, LabelSession, PairSource
from ..labeling.store import LabelLog
from ..models.base import context_length
from ..models.chat import check_fits, encode_prompts
from ..models.checkpoints import load_causal_lm
from ..models.sampling import sample
from .run import RunConfig


@dataclass
class LabelConfig:
    """The labeling page: which model's replies, where the labels go, and where the page is served."""

    model: str | None = option(
        "A model directory to sample the pairs from (default: run_dir/ppo/policy when PPO has finished, else "
        "run_dir/sft).",
        None,
    )
    out: str = option("The label log: a bare name for run_dir/NAME, or a path.", "human_preferences.jsonl")
    labeler: str = option("Your name in the log (a page opened with ?labeler=NAME labels as NAME).", "me")
    target: int = option("Labels to aim for (the progress line); labeling may go on past it.", 100)
    repeat_rate: float = option("Share of pairs shown again, sides swapped (the labeler's self-agreement).", 0.05)
    ahead: int = option("Pairs sampled ahead in the background.", 16)
    max_new_tokens: int = option("Longest reply.", 32)
    temperature: float = option("Sampling temperature.", 1.0)
    host: str = option("Address to serve on; any but 127.0.0.1/localhost needs the printed token.", "127.0.0.1")
    port: int = option("Port (0: any free one; the address is printed).", 8765)

    def __post_init__(self) -> None:
        check(self.target >= 1, "target", self.target, ">= 1, e.g. 100")
        check(0 <= self.repeat_rate < 1, "repeat_rate", self.repeat_rate, "in [0, 1), e.g. 0.05")
        check(1 <= self.ahead <= 256, "ahead", self.ahead, "in [1, 256], e.g. 16")
        check(self.max_new_tokens >= 1, "max_new_tokens", self.max_new_tokens, ">= 1")
        check(self.temperature > 0, "temperature", self.temperature, "> 0, e.g. 1.0")
        check(0 <= self.port <= 65535, "port", self.port, "in [0, 65535] (0: any free port)")
        check(bool(self.host.strip()), "host", self.host, "an address, e.g. 127.0.0.1")
        check(re.match(LABELER, self.labeler) is not None, "labeler", self.labeler, "1-40 letters, digits, _.@-")
        # one JSON object per line: the name says so, and `reward --preferences_file` reads it as a log
        check(self.out.endswith(".jsonl"), "out", self.out, "a .jsonl file, e.g. human_preferences.jsonl")


def policy_source(run: RunConfig, cfg: LabelConfig) -> tuple[str, object, object]:
    """(path, model, tokenizer) of the model the pairs come from: --model, else the finished PPO policy, else SFT."""
    rd = run.dir
    if cfg.model is not None:
        path = Path(cfg.model)
    else:
        path = rd.policy_dir("ppo").policy if (rd.policy_dir("ppo").policy / "config.json").is_file() else rd.sft
        if not (path / "config.json").is_file():
            raise UserError(f"no model to sample from in {rd.path}: run the 'sft' stage first, or pass --model DIR")
    model, tok = load_causal_lm(path, "--model")
    return str(path), model.to(run.torch_device).eval(), tok


def run_label(run: RunConfig, cfg: LabelConfig) -> int:
    """The `label` command: sample pairs ahead, serve the page until Ctrl-C, then print what was labeled."""
    # fastapi and uvicorn are the optional 'label' extra: imported only when the page is served
    try:
        from ..labeling.app import bind, open_server  # fastapi, uvicorn: the optional extra
    except ImportError as exc:
        raise UserError(
            f"the labeling page needs the 'label' extra ({exc.name} is missing): pip install -e '.[label]'"
        ) from None
    sock = bind(cfg.host, cfg.port)  # a port in use is refused before anything is loaded or written
    prompts = run.start().train_prompts
    path, model, tok = policy_source(run, cfg)
    # As `ppo` and `sample` do: a reply length that does not fit is one line now, not a failing sampler later
    check_fits(encode_prompts(tok, prompts), context_length(model.config), cfg.max_new_tokens + 1, "label")
    log_path = run.dir.under_run(cfg.out)

    def draw(batch: list[str]) -> list[str]:
        return sample(model, tok, [p for p in batch for _ in range(2)], cfg.max_new_tokens, cfg.temperature).texts

    source = PairSource(draw, prompts, path, cfg.ahead)
    try:
        session = LabelSession(LabelLog(log_path), source, cfg.target, cfg.repeat_rate, run.seed)
        print(
            f"labels go to {log_path} ({session.state.decided} so far); pairs from {path}; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        served = open_server(session, sock, cfg.labeler)
        print(f"labeling page: {served.url}", flush=True)
        served.run()
        print(f"{session.state.decided} labels in {log_path}", file=sys.stderr)
    finally:
        source.stop()
        sock.close()
    return 0
