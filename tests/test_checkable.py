"""Checkable tasks (arithmetic, Countdown) and reward functions as programs (`--reward_fn`, TRL's signature):
the checkers against hand-made replies, the problem sets, the checks on a user's function, and a run end to end."""

import builtins
import dataclasses
import json
import re

import pytest

from rlhf_toy.errors import UserError, run_cli
from rlhf_toy.lm.data.checkable import (
    CHECKABLE_TASKS,
    CheckableSettings,
    CheckableTask,
    Problem,
    arithmetic_correct,
    correctness,
    countdown_correct,
    evaluate_expression,
    final_answer,
    format_reward,
    problems,
)
from rlhf_toy.lm.data.rewards import load_reward_functions
from rlhf_toy.lm.data.tasks import get_task
from rlhf_toy.lm.pipeline.cli import main


@pytest.mark.parametrize(
    "reply,right",
    [
        ("Answer: 936", True),
        ("  Answer:   936 \n", True),  # forgiving about whitespace
        ("I think 12. Answer: 936", True),  # the last "Answer:" counts
        ("Answer: 12 Answer: 936", True),
        ("Answer: 935", False),
        ("Answer: 936.0", False),  # strict: the exact integer
        ("Answer: 936 apples", False),
        ("Answer: 93 6", False),
        ("936", False),  # no "Answer:"
        ("Answer:", False),
        ("Answer: -936", False),
    ],
)
def test_the_arithmetic_checker_is_strict_about_the_answer_and_forgiving_about_whitespace(reply, right):
    assert arithmetic_correct(reply, "936") is right


def test_final_answer_is_what_follows_the_last_answer_marker():
    assert final_answer("Answer: 1\nAnswer: 2 ") == "2"
    assert final_answer("no marker") is None


@pytest.mark.parametrize(
    "reply,right",
    [
        ("Answer: 25 + 3 * 7", True),
        ("Answer: (3 * 7) + 25", True),
        ("Answer: 7 * 3 + 25", True),
        ("Answer: 25 + 21", False),  # 21 is not a given number
        ("Answer: 25 + 3 * 7 + 0", False),  # 0 is not given either
        ("Answer: 25 + 3 * 7 * 1", False),
        ("Answer: 25 + 7 * 3 - 3 + 3", False),  # 3 used three times
        ("Answer: 25 + 3 ** 2", False),  # powers are not an operation of the game
        ("Answer: 46", False),
    ],
)
def test_the_countdown_checker_evaluates_the_expression_with_each_number_once(reply, right):
    assert countdown_correct(reply, [3, 7, 25], 46) is right


def test_countdown_division_is_exact():
    assert countdown_correct("Answer: 7 / 2 * 2", [7, 2, 2], 7)  # a float would round; fractions do not
    assert not countdown_correct("Answer: 7 / 2", [7, 2], 3)
    assert evaluate_expression("1 / 0") is None


def test_the_countdown_checker_never_evaluates_code(monkeypatch):
    def no_eval(*args, **kwargs):
        raise AssertionError("eval must not be called")

    monkeypatch.setattr(builtins, "eval", no_eval)
    for text in ("__import__('os').system('true')", "(lambda: 1)()", "[1, 2]", "-3 + 4", "x + 1", "1" * 200):
        assert evaluate_expression(text) is None, text
    assert evaluate_expression("(1 + 2) * 3") is not None


def test_the_format_reward_wants_one_answer_line():
    assert format_reward([], ["Answer: 12", " Answer: 3 + 4 ", "12", "Answer:", "Well. Answer: 3"]) == [
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
    ]


def test_problem_sets_are_seeded_and_hold_out_prompts_never_trained_on():
    s = CheckableSettings(digits=3, operations="+-*", n_train=500, n_eval=100, phrasings="one")
    train, held = problems("arithmetic", s, seed=0)
    again, _ = problems("arithmetic", s, seed=0)
    other, _ = problems("arithmetic", s, seed=1)
    assert [p.prompt for p in train] == [p.prompt for p in again] != [p.prompt for p in other]
    assert len(held) == 100 and not {p.prompt for p in held} & {p.prompt for p in train}
    for p in train + held:  # every solution is right by its own checker, every operand has three digits
        a, op, b = p.prompt.removeprefix("What is ").removesuffix("?").split()
        assert 100 <= int(a) <= 999 and 100 <= int(b) <= 999 and op in "+-*"
        assert correctness([p.prompt], [p.solution], answer=[p.columns["answer"]]) == [1.0]
    train, held = problems("countdown", CheckableSettings(numbers=4, n_train=200, n_eval=50, phrasings="one"), seed=0)
    for p in train + held:
        assert countdown_correct(p.solution, p.columns["numbers"], p.columns["target"]), p


def test_prose_demonstrations_are_right_but_not_in_the_checked_form():
    s = CheckableSettings(n_train=2000, n_eval=50, prose=0.6)
    train, held = problems("arithmetic", s, seed=0)
    plain, plain_held = problems("arithmetic", CheckableSettings(n_train=2000, n_eval=50), seed=0)
    assert [p.prompt for p in train] == [p.prompt for p in plain] and held == plain_held  # the same problems
    prose = [p for p in train if not p.solution.startswith("Answer:")]
    assert 0.55 < len(prose) / len(train) < 0.65
    for p in prose:  # "75 + 80 = 155.": the true answer, which the checker does not read
        assert p.solution.endswith(f"= {p.columns['answer']}.")
        assert correctness([p.prompt], [p.solution], answer=[p.columns["answer"]]) == [0.0]
    assert all(h.solution.startswith("Answer: ") for h in held)  # held-out problems keep the checked form


def test_a_checkable_task_scores_correctness_plus_a_little_format():
    task = get_task("arithmetic", seed=0, checkable=CheckableSettings(n_train=100, n_eval=20))
    prompt, solution = task.train[0]
    answer = solution.removeprefix("Answer: ")
    assert task.reward([prompt] * 3, [solution, f"so {answer}. Answer: {answer}", "Answer: 1000000"]) == [
        pytest.approx(1.1),
        pytest.approx(1.0),
        pytest.approx(0.1),
    ]
    assert task.judge([prompt, prompt], [solution, "Answer: 1000000"]) == [1.0, 0.0]  # gold: right or wrong
    weighted = get_task("arithmetic", seed=0, reward_weights="1,0", checkable=CheckableSettings(n_train=100, n_eval=20))
    assert weighted.reward([prompt], [solution]) == [pytest.approx(1.0)]


def test_a_trl_style_function_gets_the_other_columns_as_keyword_lists():
    columns = {"p1": {"answer": "4"}, "p2": {"answer": "9"}}
    rf = load_reward_functions("tests.reward_fns:exact,tests.reward_fns:short", "1,0.5", columns, [("p1", "4")])
    assert rf(["p2", "p1"], ["9", "5"]) == [pytest.approx(1 - 0.005), pytest.approx(-0.005)]
    assert rf.keyword_columns(["p2", "p1"]) == {"answer": ["9", "4"]}


@pytest.mark.parametrize(
    "spec,message",
    [
        ("tests.reward_fns:missing", "cannot import reward function 'tests.reward_fns:missing'"),
        ("tests.no_such_module:f", "cannot import reward function"),
        ("tests.reward_fns", "must look like module:function"),
        ("tests.reward_fns:NOT_CALLABLE", "is a int, not a function"),
        ("tests.reward_fns:needs_label", "needs the column 'label', which the prompts do not have"),
        ("tests.reward_fns:one_argument", "it must take (prompts, completions, **columns)"),
        ("tests.reward_fns:wrong_length", "returned shape (1,) for 2 completions"),
        ("tests.reward_fns:not_a_number", "returned nan for completion 0 (2 of 2 not finite); return finite numbers"),
        ("tests.reward_fns:raises", "raised KeyError"),
    ],
)
def test_a_bad_reward_function_is_one_error_before_any_sampling(spec, message):
    columns = {"p1": {"answer": "4"}, "p2": {"answer": "9"}}
    with pytest.raises(UserError, match=None) as err:
        load_reward_functions(spec, None, columns, [("p1", "4"), ("p2", "9")])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_weights_are_one_error():
    with pytest.raises(UserError, match="reward_weights must be 2 comma-separated numbers"):
        load_reward_functions("tests.reward_fns:exact,tests.reward_fns:short", "1", {"p": {"answer": "1"}}, [])


def test_the_comparison_table_reports_the_first_crossing_of_0_9_as_a_median_over_seeds():
    import numpy as np

    from rlhf_toy.lm.pipeline.reasoning import first_reaching, summarize_checkable

    curve = np.array([[0, 0, 0.0], [64, 1.0, 0.5], [128, 2.0, 0.95], [192, 3.0, 0.99]])
    assert first_reaching(curve) == (128.0, 2.0) and first_reaching(curve, 1.0) is None
    checkable = {"pass@1": 0.2, "pass@k": 0.8, "length_right": 6.0, "length_wrong": 12.0, "zero_variance": 0.2,
                 "truncated": 0.0, "entropy": 0.1, "kl": 0.5, "k": 8}  # fmt: skip
    sft = {"accuracy": 0.0, "accuracy_se": 0.0, **checkable}

    def logged(step_s, crossing):  # one seed's training log: accuracy 1.0 from step `crossing` on
        return [{"step": i, "time/train_s": i * step_s, "eval/greedy_gold": float(i >= crossing)} for i in (1, 2, 3)]

    rows = [{"accuracy": a, "wall_s": w, "episodes_per_s": 10.0, **checkable} for a, w in ((1, 5), (1, 7), (1, 100))]
    report = summarize_checkable(sft, {"m": rows}, {"m": [logged(1, 1), logged(2, 2), logged(50, 3)]}, 64)
    f = report["methods"]["m"]
    assert f["to_target"] == [128.0, 4.0] and f["reached_target"] == 3  # medians of (64, 128, 192), (1, 4, 150)
    assert f["wall_s"] == 7 and f["gain"]["mean"] == 1.0  # the slow seed moves no median
    assert "episodes to 0.9 (median)" in report["table"]


def write_prompts(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


CLI_ERRORS = [
    (["grpo", "--task", "algebra"], "unknown task 'algebra'; choose helpdesk, helpdesk-chat, chatterbot, arithmetic"),
    (["grpo", "--task", "arithmetic", "--digits", "9"], "digits must be 1 to 6"),
    (["grpo", "--task", "arithmetic", "--operations", "+/"], "operations must be some of + - *"),
    (["grpo", "--task", "countdown", "--numbers", "1"], "countdown numbers must be 2 to 6"),
    (["grpo", "--task", "arithmetic", "--prose", "1"], "prose must be a share in [0, 1)"),
    (["compare", "--task", "arithmetic", "--methods", "grpo,vapo"], "methods must be comma-separated names from"),
    (["grpo", "--task", "arithmetic", "--reward_fn", "tests.reward_fns:raises"], "raised KeyError: 'boom'"),
    (["grpo", "--task", "arithmetic", "--reward_fn", "tests.reward_fns:needs_label"], "needs the column 'label'"),
    (["grpo", "--task", "arithmetic", "--reward_weights", "1,2,3"], "reward_weights must be 2 comma-separated"),
    (["dapo", "--task", "arithmetic", "--clip_range_high", "0.1"], "clip_range_high"),
    (["grpo", "--task", "arithmetic", "--group_size", "1"], "group_size"),
    (
        ["evaluate", "--task", "arithmetic", "--policies", "", "--reference", "base"],
        "--reference base needs --base_model",
    ),
    (["evaluate", "--task", "arithmetic", "--reference", "ref"], "reference must be sft or base"),
]


@pytest.mark.parametrize("argv,message", CLI_ERRORS, ids=[" ".join(a) for a, _ in CLI_ERRORS])
def test_bad_input_on_a_checkable_task_is_one_error_line_and_writes_nothing(argv, message, tmp_path, capsys):
    run = tmp_path / "run"
    assert run_cli(main, [*argv, "--run_dir", str(run), "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not run.exists() or not any(run.iterdir())


def test_a_prompt_file_without_the_column_a_checker_needs_is_one_error(tmp_path, capsys):
    data = write_prompts(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "label": "x"} for i in range(5)])
    argv = ["tokenizer", "--data", str(data), "--reward_fn", "tests.reward_fns:exact", "--run_dir", str(tmp_path / "r")]
    assert run_cli(main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the column 'answer', which the prompts do not have (columns: label)" in err[0]


ARITHMETIC = ["--task", "arithmetic", "--digits", "1"]
GRPO_TINY = [
    "--steps",
    "4",
    "--batch_size",
    "16",
    "--minibatch_size",
    "8",
    "--max_new_tokens",
    "6",
    "--save_every",
    "0",
]


@pytest.fixture(scope="module")
def arithmetic_run(tmp_path_factory):
    """A tiny arithmetic run: digit-level tokenizer and a short SFT (1-digit problems)."""
    from tests.helpers import stage

    d = tmp_path_factory.mktemp("arith")
    assert stage("tokenizer", d, *ARITHMETIC) == 0
    assert stage("sft", d, *ARITHMETIC, "--sample_tokens", "6") == 0
    return d


@pytest.mark.integration
def test_a_checkable_run_trains_on_the_checker_and_reports_accuracy(arithmetic_run, tmp_path):
    import shutil

    from tests.helpers import stage

    run = tmp_path / "run"
    shutil.copytree(arithmetic_run, run)
    tok = json.loads((run / "sft" / "tokenizer.json").read_text())
    assert all(str(d) not in {k for k in tok["model"]["vocab"] if len(k) > 1 and k.isdigit()} for d in range(10))
    assert not (run / "reward_model").exists()  # no preferences, no reward model: the checker is the reward
    argv = [*ARITHMETIC, *GRPO_TINY, "--eval_every", "2", "--eval_prompts", "20"]
    assert stage("grpo", run, *argv) == 0
    rows = [json.loads(line) for line in (run / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/greedy_gold" in r] == [2, 4]
    assert all(0 <= r["eval/greedy_gold"] <= 1 for r in rows if "eval/greedy_gold" in r)
    assert rows[-1]["time/train_s"] >= rows[0]["time/train_s"] > 0
    summary = json.loads((run / "grpo" / "summary.json").read_text())
    assert 0 <= summary["initial_greedy_gold"] <= 1
    assert stage("evaluate", run, *ARITHMETIC, "--policies", "grpo", "--best_of", "4", "--eval_prompts", "20",
                 "--max_new_tokens", "6", "--pass_k", "4") == 0  # fmt: skip
    report = json.loads((run / "eval.json").read_text())
    assert [r["name"] for r in report["rows"]] == ["SFT", "best-of-4", "GRPO (grpo)"]
    for row in (report["rows"][0], report["rows"][2]):  # best-of-n is ranked by the reward: no greedy reply
        assert 0 <= row["pass@1"] <= row["pass@k"] <= 1 and 0 <= row["accuracy"] <= 1, row
        assert 0 <= row["zero_variance"] <= 1
    assert "pass@4" in (run / "eval.md").read_text()


@pytest.mark.integration
def test_the_same_seed_gives_the_same_checkable_run(arithmetic_run, tmp_path):
    import shutil

    from tests.helpers import stage

    out = []
    for name in ("a", "b"):
        run = tmp_path / name
        shutil.copytree(arithmetic_run, run)
        assert stage("dapo", run, *ARITHMETIC, *GRPO_TINY) == 0
        out.append([json.loads(line)["objective/score"] for line in (run / "dapo" / "metrics.jsonl").open()])
    assert out[0] == out[1]


@pytest.mark.integration
def test_compare_on_a_checkable_task_reports_accuracy_curves(arithmetic_run, tmp_path):
    import shutil

    from tests.helpers import stage

    run = tmp_path / "run"
    shutil.copytree(arithmetic_run, run)
    argv = [*ARITHMETIC, "--methods", "dr_grpo,rloo,dpo", "--seeds", "0,1", "--episodes", "32", "--batch_size", "16",
            "--eval_prompts", "10", "--eval_every", "1", "--max_new_tokens", "6"]  # fmt: skip
    assert stage("compare", run, *argv) == 0
    report = json.loads((run / "compare.json").read_text())
    assert set(report["methods"]) == {"dr_grpo", "rloo"}  # dpo has no pairs from a checker: left out, with a note
    for f in report["methods"].values():
        assert f["seeds"] == 2 and len(f["curves"]) == 2
        assert [p[0] for p in f["curves"][0]] == [0, 16, 32]  # episodes: the SFT model's accuracy, then each step
    assert "greedy accuracy" in (run / "compare.md").read_text() and (run / "compare.png").stat().st_size > 0


@pytest.mark.integration
def test_your_own_prompt_file_and_trl_style_checker_train_end_to_end(tmp_path):
    """The how-to's example: a file with an `answer` column, examples/checker.py's functions with weights; no
    reward model; the program is the gold judge too. A prompt-only file works from a --base_model."""
    from tests.helpers import stage
    from tests.hf_models import tiny_model_dir

    rows = [{"prompt": f"What is {a} plus {b}?", "response": str(a + b), "answer": str(a + b)} for a in range(12)
            for b in range(12)]  # fmt: skip
    data = write_prompts(tmp_path / "questions.jsonl", rows)
    run = tmp_path / "run"
    own = ["--data", str(data), "--reward_fn", "examples.checker:exact_answer,examples.checker:brevity"]
    own += ["--reward_weights", "1,0.1"]
    for name in ("tokenizer", "sft", "grpo"):
        assert stage(name, run, *own, *(GRPO_TINY if name == "grpo" else [])) == 0, name
    metrics = [json.loads(line) for line in (run / "grpo" / "metrics.jsonl").open()]
    assert all(0 <= r["objective/gold"] <= 1.1 for r in metrics) and not (run / "reward_model").exists()

    prompts_only = write_prompts(tmp_path / "prompts.jsonl", [{k: r[k] for k in ("prompt", "answer")} for r in rows])
    run = tmp_path / "base"
    own[1] = str(prompts_only)
    base = ["--base_model", str(tiny_model_dir("gpt2", tmp_path / "gpt2"))]
    assert stage("sft", run, *own, *base, "--epochs", "0") == 0
    assert stage("rloo", run, *own, *GRPO_TINY) == 0


@pytest.mark.integration
def test_the_reasoning_recipe_runs_every_stage(tmp_path, capsys):
    """`rlhf-toy reasoning` (its SFT cut to 300 pairs and its RL to 2 steps): tokenizer, SFT, Dr. GRPO against
    the checker, and the evaluation with the checkable figures; `all` on a checkable task is the same recipe."""
    run = tmp_path / "run"
    argv = ["reasoning", "--run_dir", str(run), "--digits", "1", "--max_train_pairs", "300", "--steps", "2"]
    assert run_cli(main, [*argv, "--threads", "1", "--progress", "False"]) == 0
    report = json.loads((run / "eval.json").read_text())
    assert [r["name"] for r in report["rows"]] == ["SFT", "Dr. GRPO (dr_grpo)"]
    assert all("pass@k" in r for r in report["rows"])
    summary = json.loads((run / "dr_grpo" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["initial_greedy_gold"] is not None
    assert '"stage": "reasoning"' in capsys.readouterr().out


@pytest.mark.integration
def test_countdown_trains_on_its_checker(tmp_path):
    from tests.helpers import stage

    run = tmp_path / "run"
    countdown = ["--task", "countdown", "--max_train_pairs", "400"]
    for name in ("tokenizer", "sft", "grpo"):
        extra = [*GRPO_TINY, "--max_new_tokens", "12"] if name == "grpo" else []  # the last value counts
        assert stage(name, run, *countdown, *extra) == 0, name
    rows = [json.loads(line) for line in (run / "grpo" / "metrics.jsonl").open()]
    assert len(rows) == 4 and all(0 <= r["objective/gold"] <= 1 for r in rows)


# A checkable task is one record ---------------------------------------------------------------------------------


def larger_problem(rng, s):
    """The worked example of docs/contributing.md: which of two numbers is larger."""
    a, b = rng.sample(range(10 ** (s.digits - 1), 10**s.digits), 2)
    return Problem(f"Which is larger, {a} or {b}?", f"Answer: {max(a, b)}", {"answer": str(max(a, b))})


def test_a_new_checkable_task_is_one_record(monkeypatch):
    record = CheckableTask("larger", "which of two numbers is larger", larger_problem,
                           ((correctness, 1.0), (format_reward, 0.1)), reads=("digits",))  # fmt: skip
    monkeypatch.setitem(CHECKABLE_TASKS, "larger", record)
    task = get_task("larger", seed=0, checkable=CheckableSettings(n_train=200, n_eval=20))
    assert task.checkable and task.train[0][0].startswith("Which is larger")
    prompt, solution = task.train[0]
    assert task.judge([prompt, prompt], [solution, "Answer: 0"]) == [1.0, 0.0]
    assert task.reward([prompt], [solution]) == [1.1]  # correctness and format, weighted


@pytest.mark.parametrize(
    ("task", "settings", "message"),
    [
        ("countdown", {"digits": 3}, "--digits is not read by the countdown task (only by arithmetic)"),
        ("countdown", {"prose": 0.5}, "--prose is not read by the countdown task"),
        ("arithmetic", {"largest": 50}, "--largest is not read by the arithmetic task (only by countdown)"),
    ],
)
def test_a_setting_the_task_does_not_read_is_refused(task, settings, message):
    with pytest.raises(UserError, match=re.escape(message)):
        problems(task, CheckableSettings(n_train=100, n_eval=10, **settings), seed=0)


def test_the_task_flag_and_its_help_come_from_the_records():
    from rlhf_toy.lm.data.tasks import TASKS
    from rlhf_toy.lm.pipeline.run import RunConfig

    assert set(CHECKABLE_TASKS) <= set(TASKS)
    assert RunConfig(task="countdown", largest=50).checkable.largest == 50  # every shared setting reaches the task
    help_text = {f.name: f.metadata["help"] for f in dataclasses.fields(RunConfig)}["task"]
    assert all(name in help_text for name in CHECKABLE_TASKS)
