"""Issue 37, part 1: checkable tasks asked in many phrasings with a template-level held-out split, and a user's
prompt file evaluated as a built-in task is (--eval_data, --heldout_fraction, --correct_at)."""

import json
import random
import re

import pytest

from rlhf_toy.errors import UserError
from rlhf_toy.lm.data.checkable import CheckableSettings, correctness, countdown_correct, problem_sets
from rlhf_toy.lm.data.phrasings import (
    AFTER,
    ARITHMETIC_CORES,
    BEFORE,
    COUNTDOWN_CORES,
    framed,
    in_words,
    render,
    split_templates,
)
from rlhf_toy.lm.data.tasks import get_task

NUMBER = r"(\d+|[a-z]+(?:[ -][a-z]+)*)"  # digits, or numbers in words


def pattern(template: str) -> re.Pattern:
    body = re.escape(template)
    for name in ("a", "b", "target"):
        body = body.replace(re.escape("{" + name + "}"), NUMBER)
    body = body.replace(re.escape("{numbers}"), rf"{NUMBER}(?:, {NUMBER})*")
    return re.compile(body)


def templates_of(prompt: str, templates) -> set[str]:
    return {t for t in templates if pattern(t).fullmatch(prompt)}


def test_there_are_a_few_dozen_question_forms_in_many_framings_and_a_quarter_is_held_out():
    cores = [c for cs in ARITHMETIC_CORES.values() for c in cs]
    assert len(cores) >= 30 and len(COUNTDOWN_CORES) >= 8
    assert len(framed(cores)) == len(cores) * len(BEFORE) * len(AFTER) >= 480
    assert any(b.strip() for b in BEFORE) and any(a.strip() for a in AFTER)  # instructions before and after
    for cs in (*ARITHMETIC_CORES.values(), COUNTDOWN_CORES):
        train, held = split_templates(cs, seed=0)
        assert cs[0] in train and not set(train) & set(held) and set(train) | set(held) == set(framed(cs))
        held_cores = {c for c in cs if c in held}  # a held-out core is held out in every framing
        assert 1 <= len(held_cores) <= len(cs) // 4 + 1 and all(f"Thanks! {c}" not in train for c in held_cores)
        assert all(not any(c in t for t in train) for c in held_cores)
        assert split_templates(cs, seed=1) != (train, held) or len(cs) < 5  # seeded


def test_numbers_in_words():
    assert [in_words(n) for n in (0, 7, 47, 120, 999)] == [
        "zero", "seven", "forty-seven", "one hundred twenty", "nine hundred ninety-nine"
    ]  # fmt: skip
    rng = random.Random(0)
    shown = [render("{a} + {b}", rng, 0.25, a=12, b=30) for _ in range(400)]
    assert 0.18 < sum(s == "twelve + thirty" for s in shown) / 400 < 0.32
    assert render("{numbers}", random.Random(0), 0.0, numbers=[3, 7]) == "3, 7"


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_held_out_problems_are_asked_only_in_phrasings_never_trained_on(task):
    s = (
        CheckableSettings(n_train=3000, n_eval=200, operations="+-*")
        if task == "arithmetic"
        else CheckableSettings(n_train=3000, n_eval=200)
    )
    train, held, held_in = problem_sets(task, s, 0)
    lists = ARITHMETIC_CORES.values() if task == "arithmetic" else [COUNTDOWN_CORES]
    every = [t for cs in lists for t in framed(cs)]
    trained = {t for cs in lists for t in split_templates(cs, 0)[0]}
    unseen = {t for cs in lists for t in split_templates(cs, 0)[1]}
    used_train = set().union(*(templates_of(p.prompt, every) for p in train))
    assert used_train <= trained and len(used_train) > 0.9 * len(trained)  # (nearly) every training phrasing used
    for p in held:
        assert templates_of(p.prompt, every) <= unseen and templates_of(p.prompt, unseen), p.prompt
    for p in held_in:
        assert templates_of(p.prompt, every) <= trained, p.prompt
    assert [p.columns for p in held] == [p.columns for p in held_in]  # the same problems, asked two ways
    assert not {p.prompt for p in held} & {p.prompt for p in train}
    for p in train + held:  # every solution is right by its checker
        if task == "arithmetic":
            assert correctness([p.prompt], [p.solution], answer=[p.columns["answer"]]) == [1.0]
        else:
            assert countdown_correct(p.solution, p.columns["numbers"], p.columns["target"])
    words = sum(not any(c.isdigit() for c in p.prompt) for p in train) / len(train)
    assert 0.18 < words < 0.32 if task == "arithmetic" else words == 0  # countdown: digits (a short prompt)


def test_one_phrasing_is_the_canonical_task():
    train, held, held_in = problem_sets("arithmetic", CheckableSettings(n_train=500, n_eval=50, phrasings="one"), 0)
    assert held_in is held and all(re.fullmatch(r"What is \d+ [-+] \d+\?", p.prompt) for p in train + held)
    task = get_task("arithmetic", checkable=CheckableSettings(n_train=500, n_eval=50, phrasings="one"))
    assert task.extra_evals == {} and task.eval_name == "held-out"
    task = get_task("arithmetic", checkable=CheckableSettings(n_train=500, n_eval=50))
    assert task.eval_name == "held-out phrasings" and len(task.extra_evals["training phrasings"]) == 50


# A user's prompt file -----------------------------------------------------------------------------------------


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [{"prompt": f"Add {a} and {b}.", "answer": str(a + b)} for a in range(10) for b in range(10)]


def test_heldout_fraction_and_eval_data_split_a_users_file(tmp_path):
    data = write_rows(tmp_path / "train.jsonl", ROWS)
    t = get_task("helpdesk", data=data, reward_fn="tests.reward_fns:exact", heldout_fraction=0.3)
    assert len(t.eval_prompts) == 30 and not set(t.eval_prompts) & set(t.train_prompts)
    other = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(3) for b in range(3)]
    evals = write_rows(tmp_path / "eval.jsonl", other)
    t = get_task("helpdesk", data=data, reward_fn="tests.reward_fns:exact", eval_data=evals)
    assert len(t.train_prompts) == 100 and t.eval_prompts == [r["prompt"] for r in other]
    assert t.reward(["What is 1 plus 2?"], ["3"]) == [1.0]  # the eval file's columns reach the reward functions
    with pytest.raises(UserError, match="shares 1 prompt"):
        get_task("helpdesk", data=data, reward_fn="tests.reward_fns:exact", eval_data=write_rows(
            tmp_path / "bad.jsonl", [ROWS[5]]))  # fmt: skip


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"eval_data": "x.jsonl"}, "held-out set of a --data file"),
        ({"heldout_fraction": 0.0, "data": "D"}, r"heldout_fraction must be in \(0, 1\)"),
        ({"heldout_fraction": 0.2, "eval_data": "x.jsonl", "data": "D"}, "drop --heldout_fraction"),
        ({"correct_at": 1.0}, "--correct_at marks a reply right"),
        ({"correct_at": 1.0, "data": "D", "reward_fn": "tests.reward_fns:exact", "judge": "tests.judges:length"},
         "--correct_at marks a reply right"),
    ],
)  # fmt: skip
def test_the_data_flags_are_refused_where_they_would_be_ignored(tmp_path, kwargs, message):
    if kwargs.get("data") == "D":
        kwargs["data"] = write_rows(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(UserError, match=message):
        get_task("helpdesk", **kwargs)


def test_correct_at_or_a_boolean_checker_makes_a_users_file_checkable(tmp_path):
    data = write_rows(tmp_path / "train.jsonl", ROWS)
    t = get_task("helpdesk", data=data, reward_fn="tests.reward_fns:exact")
    assert not t.checkable  # a reward of degree: no accuracy without a threshold
    t = get_task("helpdesk", data=data, reward_fn="tests.reward_fns:exact", correct_at=1.0)
    assert t.checkable and t.judge(["Add 1 and 2."] * 2, ["3", "4"]) == [1.0, 0.0]
    t = get_task("helpdesk", data=data, reward_fn="tests.reward_fns:is_right")
    assert t.checkable and t.judge(["Add 1 and 2."] * 2, [" 3 ", "4"]) == [1.0, 0.0]


@pytest.mark.integration
def test_a_users_prompt_files_and_checker_get_the_checkable_evaluation(tmp_path):
    """A user's training file (their own phrasings, with demonstrations), a separate evaluation file in other
    phrasings, and their TRL-signature checker with --correct_at: tokenizer, SFT, GRPO and evaluate run, and the
    evaluation reports accuracy, pass@1 and pass@k on the evaluation file."""
    from tests.helpers import stage

    rng = random.Random(0)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    train = [{"prompt": f"Add {a} and {b}, please.", "response": f"Answer: {a + b}", "answer": str(a + b)}
             for a, b in pairs[:80]]  # fmt: skip
    held = [{"prompt": f"What do {a} and {b} make together?", "answer": str(a + b)} for a, b in pairs[80:]]
    flags = ["--data", write_rows(tmp_path / "mine.jsonl", train), "--eval_data",
             write_rows(tmp_path / "mine_eval.jsonl", held), "--reward_fn", "examples.checker:exact_answer",
             "--correct_at", "1"]  # fmt: skip
    run = tmp_path / "run"
    assert stage("tokenizer", run, *flags) == 0
    assert stage("sft", run, *flags, "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--epochs", "1") == 0
    assert json.loads((run / "sft.json").read_text())["eval_loss"] is None  # the eval file has no replies to score
    grpo = ["--steps", "2", "--batch_size", "8", "--minibatch_size", "8", "--max_new_tokens", "6"]
    assert stage("grpo", run, *flags, *grpo) == 0
    assert stage("evaluate", run, *flags, "--policies", "grpo", "--best_of", "", "--pass_k", "4") == 0
    report = json.loads((run / "eval.json").read_text())
    assert report["prompts"] == 20 and report["settings"]["data"].endswith("mine.jsonl")
    for row in report["rows"]:
        assert {"accuracy", "pass@1", "pass@k"} <= set(row) and 0 <= row["accuracy"] <= 1
        assert 0 <= row["pass@1"] <= row["pass@k"] <= 1
    assert "pass@4" in (run / "eval.md").read_text()


def test_heldout_fraction_without_a_users_file_is_refused():
    from rlhf_toy.lm.pipeline.run import RunConfig

    with pytest.raises(UserError, match="--heldout_fraction holds out part of a user's file"):
        RunConfig(heldout_fraction=0.3)
    RunConfig(heldout_fraction=0.3, preferences_file="prefs.jsonl")  # the reward stage's pairs: allowed
