"""The run report (issue 26): each alarm's detector on hand-built curves and on real runs built to trigger it, the
page in headless Chromium (no console error, the alarms shown), trackers, the command and its bad input."""

import json
import math
import random
import re
import shutil
from pathlib import Path

import pytest

from rlhf_toy.errors import UserError
from rlhf_toy.logging import MetricLogger, trackers
from rlhf_toy.report.alarms import ALARMS, raised, window
from rlhf_toy.report.page import RunRecord, render, write_report
from tests.helpers import stage

DATA = Path(__file__).parent / "data"


def rows_of(n=100, seed=0, **curves):
    """`n` logged steps; each keyword is a function of the step (0..n-1) giving that key's value, plus small noise."""
    rng = random.Random(seed)
    return [{"step": t + 1, **{k.replace("__", "/"): f(t) + rng.gauss(0, 0.01) for k, f in curves.items()}}
            for t in range(n)]  # fmt: skip


def names(rows):
    return {a.name for a in raised(rows)}


CALM = dict(
    objective__score=lambda t: min(1.0, t / 30),
    objective__gold=lambda t: min(0.8, t / 35),
    objective__kl=lambda t: min(2.0, t / 20),
    policy__entropy=lambda t: 0.5 - 0.001 * t,
    policy__response_length=lambda t: 15.0,
    policy__eos_rate=lambda t: 1.0,
    policy__distinct_2=lambda t: 0.3,
    ppo__clip_fraction=lambda t: 0.02,
    ppo__approx_kl=lambda t: 0.002,
    ppo__value_loss=lambda t: 0.3 / (1 + t / 10),
    ppo__explained_variance=lambda t: min(0.8, t / 50),
)


def test_a_calm_run_raises_nothing():
    assert names(rows_of(**CALM)) == set()


@pytest.mark.parametrize(
    "alarm, change",
    [
        ("negative-kl", {"objective__kl": lambda t: -0.05}),
        ("entropy-collapse", {"policy__entropy": lambda t: 0.5 if t < 30 else 0.05}),
        ("length-exploitation", {"policy__response_length": lambda t: 15 + 0.2 * t, "objective__gold": lambda t: 0.3}),
        ("truncation", {"policy__eos_rate": lambda t: 1.0 if t < 40 else 0.6}),
        ("repetition", {"policy__distinct_2": lambda t: 0.3 if t < 40 else 0.1}),
        ("update-spike", {"ppo__clip_fraction": lambda t: 0.6 if t == 50 else 0.02}),
        ("value-divergence", {"ppo__value_loss": lambda t: 0.1 * 1.1**t, "ppo__explained_variance": lambda t: -0.5}),
        ("equal-groups", {"sampling__equal_groups": lambda t: 0.2 if t < 50 else 0.8}),
    ],
)
def test_each_alarm_fires_on_its_curve_and_only_then(alarm, change):
    assert alarm in names(rows_of(**{**CALM, **change}))
    assert alarm not in names(rows_of(**CALM))


@pytest.mark.parametrize(
    "alarm, change",
    [
        ("runaway-kl", {"objective__kl": lambda t: 2.0 if t < 40 else 5.0 * (t - 38)}),
        ("solved-groups", {"sampling__equal_groups": lambda t: 0.9, "sampling__solved_groups": lambda t: 0.85}),
    ],
)
def test_the_new_alarms_fire_on_their_curves(alarm, change):
    assert alarm in names(rows_of(**{**CALM, **change}))
    assert alarm not in names(rows_of(**CALM))


def test_equal_groups_that_are_all_right_are_a_note_and_all_wrong_an_alarm():
    solved = {"sampling__equal_groups": lambda t: 0.9, "sampling__solved_groups": lambda t: 0.88,
              "sampling__failed_groups": lambda t: 0.0}  # fmt: skip
    found = raised(rows_of(**{**CALM, **solved}))
    assert [(a.name, a.severity) for a in found] == [("solved-groups", "note")]
    assert not any(a.cause for a in found)  # a note is never the cause
    failed = {"sampling__equal_groups": lambda t: 0.9, "sampling__solved_groups": lambda t: 0.0,
              "sampling__failed_groups": lambda t: 0.88}  # fmt: skip
    [alarm] = raised(rows_of(**{**CALM, **failed}))
    assert alarm.name == "equal-groups" and "all wrong by the gold checker" in alarm.detail


def test_alarms_are_ordered_by_the_step_they_fired_and_the_first_is_the_cause():
    broken = {
        "ppo__clip_fraction": lambda t: 0.7 if t == 3 else 0.02,  # the update that broke it
        "policy__distinct_2": lambda t: 0.3 if t < 40 else 0.05,  # what followed
        "objective__kl": lambda t: 1.0 if t < 20 else 20.0 * (t - 18),
    }
    found = raised(rows_of(**{**CALM, **broken}))
    assert [a.name for a in found][:1] == ["update-spike"] and found[0].cause and found[0].step == 4
    assert {"runaway-kl", "repetition"} <= {a.name for a in found}
    assert [a.step for a in found] == sorted(a.step for a in found)
    assert sum(a.cause for a in found) == 1


def test_the_overoptimization_alarm_quotes_golds_peak_from_the_start():
    """A run that breaks at once: gold starts near +0.4 and falls; the alarm quotes the start's peak."""
    early = {"objective__gold": lambda t: 0.4 if t < 2 else -0.7, "objective__score": lambda t: 0.1 * t}
    [a] = [a for a in raised(rows_of(**{**CALM, **early})) if a.name == "overoptimization"]
    assert re.match(r"gold peaked at 0\.(39|40|41)\d \(step [12]\) and fell by 0\.", a.detail), a.detail


def test_alarm_texts_follow_the_kind_of_reward():
    rows = rows_of(**{**CALM, "objective__gold": lambda t: min(0.8, t / 35) if t < 50 else 0.8 - 0.03 * (t - 50),
                      "objective__score": lambda t: t / 30})  # fmt: skip
    titles = {}
    for kind in (None, "reward model", "ensemble", "program", "labels"):
        [a] = [a for a in raised(rows, kind) if a.name == "overoptimization"]
        titles[kind] = (a.title, a.explanation)
    assert titles[None] == titles["reward model"] and "Goodhart" in titles[None][1]
    assert titles["labels"][0] == "The gold judge disagrees with your reward"
    assert "reward model" not in titles["program"][1] and "program" in titles["program"][1]
    assert len({t for t in titles.values()}) == 4


def test_length_exploitation_accounts_for_the_length_limit():
    """Replies that start at 26 tokens under a 32-token cap can never grow by 25%: growing into the cap with flat gold
    fires the alarm (half the way to the limit counts); the same run without the limit logged does not, and replies
    that stay put under the cap do not."""
    into_cap = {**CALM, "policy__response_length": lambda t: min(32.0, 26 + 0.3 * t), "objective__gold": lambda t: 0.3}
    assert "length-exploitation" in names(rows_of(**into_cap, policy__length_limit=lambda t: 32.0))
    assert "length-exploitation" not in names(rows_of(**into_cap))  # 32 < 1.25 x 26: no limit, no alarm
    steady = {**into_cap, "policy__response_length": lambda t: 26.0}
    assert "length-exploitation" not in names(rows_of(**steady, policy__length_limit=lambda t: 32.0))
    rising_gold = {**into_cap, "objective__gold": lambda t: min(0.8, t / 35)}  # longer and better: no alarm
    assert "length-exploitation" not in names(rows_of(**rising_gold, policy__length_limit=lambda t: 32.0))


def test_non_finite_values_fire_except_where_nan_means_not_applicable():
    rows = rows_of(**CALM)
    rows[10]["ppo/clip_range"] = math.nan  # no clipping configured
    rows[11]["ppo/explained_variance"] = math.nan  # returns that did not vary
    assert "non-finite" not in names(rows)
    rows[60]["ppo/value_loss"] = math.inf
    found = [a for a in raised(rows) if a.name == "non-finite"]
    assert found and found[0].step == 61 and "ppo/value_loss" in found[0].detail


def test_overoptimization_fires_after_gold_turns_down_not_before():
    peak = 60
    rows = rows_of(
        n=150,
        objective__score=lambda t: t / 50,  # the proxy keeps rising
        objective__gold=lambda t: 0.4 + 0.005 * min(t, peak) - 0.02 * max(0, t - peak),  # turns down at step 61
    )
    (a,) = [a for a in raised(rows) if a.name == "overoptimization"]
    assert peak + 1 <= a.step <= peak + 1 + window(150)
    flat = rows_of(n=150, objective__score=lambda t: t / 50, objective__gold=lambda t: 0.4 + 0.005 * min(t, peak))
    assert "overoptimization" not in names(flat)  # a plateau's wobble is not a fall


def test_the_recorded_overoptimization_run_fires_within_a_window_of_golds_turn():
    """A real log: the over-optimization preset's run (`overoptimization --remedies none`: PPO at beta 0.003 on the
    toy run). The alarm fires after gold's moving average turns down, within one window of the turn, and gold does
    fall on: by more than 0.2 below the peak while the reward model's score keeps rising."""
    from rlhf_toy.logging import moving_average

    rows = RunRecord.load(DATA / "overopt_run").rows
    (a,) = [a for a in raised(rows) if a.name == "overoptimization"]
    w = window(len(rows))
    steps = [r["step"] for r in rows]
    gold = moving_average([r["objective/gold"] for r in rows], w)
    proxy = moving_average([r["objective/score"] for r in rows], w)
    at = steps.index(a.step)
    turn = int(gold[: at + 1].argmax())
    assert turn < at <= turn + w, (steps[turn], a.step, w)
    later = slice(at, at + 4 * w)
    assert gold[later].min() < gold[turn] - 0.2 and proxy[later].max() > proxy[turn] + 0.3


def test_the_recorded_default_toy_run_raises_no_alarm():
    """A real log: the toy run's default PPO (`rlhf-toy ppo`, 200 steps)."""
    assert raised(RunRecord.load(DATA / "default_run").rows) == []


def test_every_alarm_has_an_explanation_section():
    page = (Path(__file__).parents[1] / "docs/reference/alarms.md").read_text()
    for a in ALARMS:
        assert f'id="{a.name}"' in page or f"{{#{a.name}}}" in page, a.name


# Trackers.
def test_report_to_follows_transformers_convention():
    assert trackers("none") == () and trackers("tensorboard") == ("tensorboard",)
    assert set(trackers("all")) <= {"tensorboard", "trackio"}
    with pytest.raises(UserError, match="'wandb' is not a tracker"):
        trackers("wandb")


def test_trackio_receives_every_scalar(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    log = MetricLogger(tmp_path / "run", report_to=("trackio",), project="rlhf-toy-test")
    for step in range(1, 4):
        log.log(step, {"objective/score": step / 10, "note": "text is not a scalar"})
    log.close()
    assert (tmp_path / "trackio" / "rlhf-toy-test.db").is_file()
    assert "Uploading" not in capfd.readouterr().out  # a local database: nothing is uploaded, and none is said


# The page and the command.
@pytest.fixture(scope="module")
def alarm_runs(run_dir, tmp_path_factory):
    """Real tiny runs: the standard one, one with a high learning rate and no KL (its entropy collapses, an update
    spikes, replies repeat), one whose gold judge likes nothing (replies grow, gold does not), and GRPO on a
    constant reward (every group equal)."""
    root = tmp_path_factory.mktemp("alarms")
    shutil.copytree(run_dir, root / "run")
    run = root / "run"
    fast = ["--batch_size", "8", "--minibatch_size", "4", "--max_new_tokens", "32", "--report_every", "10"]
    runs = {
        "standard": ["--steps", "10", "--judge", "tests.judges:length"],
        "collapse": ["--steps", "30", "--learning_rate", "2e-2", "--kl_coef", "0", "--judge", "tests.judges:length"],
        "length": ["--steps", "40", "--learning_rate", "3e-3", "--kl_coef", "0", "--judge", "tests.judges:constant"],
    }
    for name, flags in runs.items():
        assert stage("ppo", run, *fast, *flags, "--policy_dir", name) == 0, name
    grpo = ["--steps", "6", "--reward_fn", "tests.reward_fns:constant"]
    assert stage("grpo", run, *fast, *grpo, "--policy_dir", "equal") == 0
    # the same groups judged by a checker: all right (a note), all wrong (an alarm)
    assert stage("grpo", run, *fast, *grpo, "--judge", "tests.judges:right", "--policy_dir", "solved") == 0
    assert stage("grpo", run, *fast, *grpo, "--judge", "tests.judges:constant", "--policy_dir", "failed") == 0
    broken = ["--steps", "20", "--learning_rate", "1e-2", "--kl_coef", "0", "--judge", "tests.judges:length"]
    assert stage("ppo", run, *fast, *broken, "--policy_dir", "broken") == 0
    return run


@pytest.mark.integration
def test_real_runs_built_to_trigger_alarms_raise_them(alarm_runs):
    runs = ("standard", "collapse", "length", "equal", "solved", "failed", "broken")
    found = {d: names(RunRecord.load(alarm_runs / d).rows) for d in runs}
    assert found["standard"] <= {"truncation"}  # the tiny model's 64-token context cuts 30-40% of its replies
    assert {"entropy-collapse", "update-spike", "repetition"} <= found["collapse"]
    assert "length-exploitation" in found["length"]
    assert "equal-groups" in found["equal"]
    assert "solved-groups" in found["solved"] and "equal-groups" not in found["solved"]
    assert "equal-groups" in found["failed"] and "solved-groups" not in found["failed"]
    first = raised(RunRecord.load(alarm_runs / "broken").rows)
    assert "runaway-kl" in {a.name for a in first}
    assert first[0].cause and first[0].name == "update-spike", [(a.name, a.step) for a in first]
    for d in found:  # the report was written while training, with sampled replies by step
        assert (alarm_runs / d / "report.html").is_file()
    samples = RunRecord.load(alarm_runs / "standard").samples
    assert [s["step"] for s in samples] == [1, 10]
    assert set(samples[0]["samples"][0]) == {"prompt", "response", "score", "gold", "kl", "tokens"}


@pytest.mark.integration
def test_the_report_page_renders_its_alarms_in_a_browser(alarm_runs, browser, artifacts, capsys, tmp_path_factory):
    from rlhf_toy.errors import run_cli
    from rlhf_toy.lm.pipeline.cli import main

    assert run_cli(main, ["report", str(alarm_runs / "collapse")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes"] < 5e6
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    problems = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto((alarm_runs / "collapse" / "report.html").as_uri())
    shown = page.eval_on_selector_all(".alarm", "els => els.map(e => e.dataset.alarm)")
    assert {"entropy-collapse", "update-spike", "repetition"} <= set(shown)
    assert page.locator(".chart canvas").count() >= 10  # uPlot drew the curves
    page.fill("#search", "zzz-no-such-reply")
    assert page.eval_on_selector_all("#samples tbody tr", "rs => rs.filter(r => !r.hidden).length") == 0
    page.fill("#search", "")
    assert page.eval_on_selector_all("#samples tbody tr", "rs => rs.filter(r => !r.hidden).length") > 0
    # the earliest alarm is marked as the cause; every explanation is in the page, no link to a source file
    assert page.eval_on_selector_all(".alarm", "els => els.map(e => !!e.querySelector('.cause'))")[0]
    assert page.locator(".alarm .cause").count() == 1
    assert page.locator(".alarm details summary").count() >= 3 and page.locator(".alarm a").count() == 0
    # an unbroken reply wraps in its cell; a figure a sample does not define (no gold judge) shows as n/a
    crafted = tmp_path_factory.mktemp("crafted")
    (crafted / "metrics.jsonl").write_text(json.dumps({"step": 1, "objective/score": 1.0}) + "\n")
    sample = {"prompt": "hi", "response": "Sure" * 400, "score": 1.0, "gold": None, "kl": 0.5, "tokens": 32}
    (crafted / "samples.jsonl").write_text(json.dumps({"step": 1, "samples": [sample]}) + "\n")
    other = browser.new_page(viewport={"width": 1200, "height": 900})
    other.set_content(render([RunRecord.load(crafted)], "crafted"))
    assert other.evaluate("document.documentElement.scrollWidth") <= 1200
    cells = other.eval_on_selector_all("#samples td", "els => els.map(e => e.textContent)")
    assert cells[5] == "n/a" and cells[3].startswith("SureSure"), cells[:8]
    page.goto((alarm_runs / "collapse" / "report.html").as_uri())
    page.screenshot(path=str(artifacts / "report-page.png"), full_page=True)
    assert not problems, problems


@pytest.mark.integration
def test_several_runs_overlay_and_a_run_directory_collects_its_runs(alarm_runs, browser):
    path = write_report([alarm_runs])  # the run directory: every policy run in it, overlaid
    page = browser.new_page()
    page.goto(path.as_uri())
    assert page.eval_on_selector_all(".calm, .alarm", "els => new Set(els.map(e => e.dataset.run)).size") == 7
    legend = page.text_content(".chart")
    assert "standard:" in legend and "collapse:" in legend


def test_report_bad_input_is_one_line(tmp_path, capsys):
    from rlhf_toy.errors import run_cli
    from rlhf_toy.lm.pipeline.cli import main

    assert run_cli(main, ["report", str(tmp_path / "nowhere")]) == 2
    assert "no run in" in capsys.readouterr().err
    assert run_cli(main, ["report"]) == 2
    assert "runs must be at least one run directory" in capsys.readouterr().err
    for flags, message in (
        (["--report_to", "wandb"], "'wandb' is not a tracker; use tensorboard, trackio, all or none"),
        (["--report_every", "-1"], "report_every must be >= 0"),
    ):
        assert run_cli(main, ["ppo", "--run_dir", str(tmp_path / "r"), *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and message in err
        assert not (tmp_path / "r").exists()  # refused before anything was written


def test_the_page_is_self_contained():
    html = render([RunRecord("r", Path("r"), rows_of(**CALM))], "r")
    assert "<script src" not in html and '<link rel="stylesheet"' not in html and "fetch(" not in html
    assert '"objective/score"' in html  # the data is inlined


@pytest.mark.integration
def test_cartpole_writes_its_report(tmp_path, capsys):
    from cartpole.cli import main
    from rlhf_toy.errors import run_cli

    out = tmp_path / "cp"
    args = ["train", "--seed", "0", "--total_steps", "4096", "--out", str(out), "--progress", "False"]
    assert run_cli(main, args) == 0
    assert (out / "report.html").is_file() and (out / "settings.json").is_file()
    rows = RunRecord.load(out).rows
    assert "charts/episodic_length" in rows[-1] and "losses/grad_norm" in rows[-1]
    assert run_cli(main, ["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").is_file()


def test_the_reward_kind_comes_from_the_run_and_words_the_page(tmp_path):
    """A policy run trained on a reward model of the user's own labels: the over-optimization alarm says that the
    gold judge disagrees with the user's reward, not "Goodhart"."""
    from rlhf_toy.lm.data.tasks import Task
    from rlhf_toy.lm.pipeline.run import RunConfig
    from rlhf_toy.lm.pipeline.stages import reward_kind

    run = RunConfig(run_dir=str(tmp_path))
    task = Task("t", [("p", "r")], [("p", "r")], judge=lambda p, r: [0.0] * len(r))
    assert reward_kind(run, task) == "reward model"
    (tmp_path / "reward.json").write_text(json.dumps({"preferences": "labels"}))
    assert reward_kind(run, task) == "labels"
    (tmp_path / "reward_model").mkdir()
    (tmp_path / "reward_model" / "ensemble.json").write_text("{}")
    assert reward_kind(run, task) == "ensemble"
    task.reward = lambda p, r: [0.0] * len(r)  # type: ignore[assignment]
    assert reward_kind(run, task) == "program"

    rows = rows_of(**{**CALM, "objective__gold": lambda t: min(0.8, t / 35) if t < 50 else 0.8 - 0.03 * (t - 50),
                      "objective__score": lambda t: t / 30})  # fmt: skip
    d = tmp_path / "ppo"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "settings.json").write_text(json.dumps({"settings": {}, "preset": {}, "reward_kind": "labels"}))
    page = render([RunRecord.load(d)], "labels")
    assert "The gold judge disagrees with your reward" in page and "Goodhart" not in page


HEALTHY = sorted((DATA / "healthy").glob("*.jsonl"))


@pytest.mark.parametrize("log", HEALTHY, ids=[p.stem for p in HEALTHY])
def test_a_healthy_run_of_every_algorithm_raises_no_alarm(log):
    """Real logs (tests/data/README.md): each online algorithm's command on its defaults after `all`'s stages (DAPO,
    whose record has no KL penalty, on the checkable task it is meant for), and the `reasoning` recipe's run; a
    note (the task is learned) is allowed, an alarm is not."""
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    kind = "program" if log.stem.startswith("reasoning") else "reward model"
    assert [(a.name, a.step, a.detail) for a in raised(rows, kind) if a.severity == "alarm"] == []


def test_every_online_algorithm_has_a_healthy_log():
    from rlhf_toy.lm.algorithms.online import ALGORITHMS

    assert {a.name for a in ALGORITHMS.values()} <= {p.stem.removeprefix("reasoning_") for p in HEALTHY}


def test_dapo_without_a_kl_penalty_on_a_reward_model_raises_the_right_alarms_in_order():
    """A real log (tests/data/README.md): `rlhf-toy dapo` on its defaults (no KL penalty: its record is meant for
    checkers) against the toy reward model. Gold peaks and falls while the reward rises, then the KL runs away and
    replies grow repetitive: the first alarm is the over-optimization, the cause of the rest."""
    rows = [json.loads(line) for line in (DATA / "dapo_toy_run.jsonl").read_text().splitlines()]
    found = raised(rows, "reward model")
    assert found[0].name == "overoptimization" and found[0].cause
    assert {"runaway-kl", "repetition"} <= {a.name for a in found}
