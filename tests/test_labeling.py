"""The labeling loop (issue 25): the label log, the session, the web app's refusals over real HTTP, and the page in
headless Chromium (keyboard labels, undo, a kill and a resume, two pages at once, a simulated labeler whose
labels train a reward model)."""

import json
import multiprocessing
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rlhf_toy.lm.data.tasks import load_judge
from rlhf_toy.lm.labeling.browser import (
    choice_key,
    press_and_wait,
    shown_pair,
    simulate_labeler,
    start_label,
    wait_for_pair,
)
from rlhf_toy.lm.labeling.session import LabelError, LabelSession, PairSource
from rlhf_toy.lm.labeling.store import (
    TIE_LABEL,
    LabelLog,
    agreement,
    is_label_log,
    label_row,
    log_pairs,
    read_log,
    retraction_row,
)
from tests.helpers import stage

length = load_judge("tests.judges:length")  # the tiny run's judge: the longer reply wins


def draw(prompts):
    """Two different replies per prompt, a pure function of the prompt (a real `draw`, no model needed)."""
    return [t for p in prompts for t in (f"yes, {p} sure", f"no: {p}")]


def session_on(path, repeat_rate=0.0, target=10, seed=0):
    return LabelSession(LabelLog(path), PairSource(draw, [f"q{i}" for i in range(50)], "m", ahead=4), target,
                        repeat_rate, seed)  # fmt: skip


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


# The log.
def test_label_rows_keep_trl_columns_and_the_shown_order():
    left = label_row("a" * 16, "p", "L", "R", "left", "ana", "m", None)
    right = label_row("b" * 16, "p", "L", "R", "right", "ana", "m", None)
    tie = label_row("c" * 16, "p", "L", "R", "tie", "ana", "m", None)
    assert (left["chosen"], left["rejected"], left["shown_order"]) == ("L", "R", ["chosen", "rejected"])
    assert (right["chosen"], right["rejected"], right["shown_order"]) == ("R", "L", ["rejected", "chosen"])
    assert tie["tie"] and not tie["skip"] and tie["chosen"] == "L"
    assert set(left) >= {"prompt", "chosen", "rejected", "tie", "skip", "shown_order", "labeler", "time", "model"}


def test_retraction_undoes_a_label_and_pairs_carry_tie_labels(tmp_path):
    log = LabelLog(tmp_path / "h.jsonl")
    log.open()
    rows = [label_row(f"{i:016x}", f"p{i}", "L", "R", c, "ana", "m", None) for i, c in
            enumerate(["left", "right", "tie", "skip", "left"])]  # fmt: skip
    for r in rows:
        log.append(r)
    log.append(retraction_row(rows[4]["pair_id"], "ana"))
    state = read_log(log.path)
    assert list(state.labels) == [r["pair_id"] for r in rows[:4]] and state.decided == 3 and state.retractions == 1
    pairs = log_pairs(log.path)
    assert pairs["chosen"] == ["L", "R", "L"] and pairs["label"] == [1.0, 1.0, TIE_LABEL]
    assert is_label_log(log.path) and not is_label_log(tmp_path / "other.jsonl")


def test_open_cuts_a_partial_last_line_a_kill_left(tmp_path, capsys):
    log = LabelLog(tmp_path / "h.jsonl")
    log.open()
    log.append(label_row("a" * 16, "p", "L", "R", "left", "ana", "m", None))
    with open(log.path, "a") as f:
        f.write('{"pair_id": "bbbb')  # a kill mid-write
    assert len(log.open().labels) == 1
    assert "partial last line" in capsys.readouterr().err
    log.append(label_row("c" * 16, "p", "L", "R", "right", "ana", "m", None))
    assert [r["pair_id"] for r in lines(log.path)] == ["a" * 16, "c" * 16]


def test_agreement_compares_the_same_reply_across_swapped_sides():
    first = label_row("a" * 16, "p", "L", "R", "left", "ana", "m", None)
    again = label_row("b" * 16, "p", "R", "L", "right", "ana", "m", "a" * 16)  # sides swapped, same reply chosen
    flip = label_row("c" * 16, "p", "R", "L", "left", "ana", "m", "a" * 16)
    assert agreement([first, again]) == (1, 1)
    assert agreement([first, flip]) == (0, 1)


def _append_many(path, who, n):
    log = LabelLog(path)
    for i in range(n):
        log.append(label_row(f"{who}{i:015x}", "p" * 500, "L" * 300, "R" * 300, "left", who, "m", None))


def test_two_processes_appending_at_once_lose_and_tear_nothing(tmp_path):
    path = tmp_path / "h.jsonl"
    LabelLog(path).open()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, w, 150)) for w in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = lines(path)
    assert len(rows) == 300 and len({r["pair_id"] for r in rows}) == 300


# The session.
def test_session_labels_undoes_and_refuses(tmp_path):
    s = session_on(tmp_path / "h.jsonl")
    try:
        a = s.next_pair("ana")
        assert a.left != a.right and a.prompt in a.left + a.right
        s.label(a.pair_id, "right", "ana")
        with pytest.raises(LabelError) as again:
            s.label(a.pair_id, "left", "ana")
        assert again.value.status == 409
        with pytest.raises(LabelError) as unknown:
            s.label("f" * 16, "left", "ana")
        assert unknown.value.status == 404
        b = s.next_pair("ana")
        back = s.undo("ana", b.pair_id)
        assert (back.pair_id, back.left, back.right) == (a.pair_id, a.left, a.right)  # shown as it was
        assert s.next_pair("ana").pair_id == b.pair_id  # the pair that was on screen comes after it
        with pytest.raises(LabelError):
            s.undo("bo", None)  # bo labeled nothing
        s.label(a.pair_id, "left", "ana")
        assert s.progress()["labeled"] == 1
    finally:
        s.source.stop()
    rows = lines(tmp_path / "h.jsonl")
    assert [("retracts" in r, r.get("choice")) for r in rows] == [(False, "right"), (True, None), (False, "left")]


def test_session_resumes_from_the_log_and_repeats_with_sides_swapped(tmp_path):
    s = session_on(tmp_path / "h.jsonl", repeat_rate=0.5)
    try:
        seen = {}
        for _ in range(30):
            p = s.next_pair("ana")
            if p.repeat_of:
                first = seen[p.repeat_of]
                assert (p.left, p.right) == (first.right, first.left)
            seen[p.pair_id] = p
            s.label(p.pair_id, "left", "ana")
        assert any(p.repeat_of for p in seen.values())
        assert s.progress()["agreement"] is not None  # refreshed at 20 labels
    finally:
        s.source.stop()
    resumed = session_on(tmp_path / "h.jsonl")
    try:
        assert resumed.progress()["labeled"] == 30
    finally:
        resumed.source.stop()


# The web app over real HTTP (uvicorn on a free port, in a thread).
@pytest.fixture
def served(tmp_path, request):
    from rlhf_toy.lm.labeling.app import bind, open_server

    host = getattr(request, "param", "127.0.0.1")
    s = session_on(tmp_path / "h.jsonl")
    server = open_server(s, bind(host, 0), "ana")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.server.started:
        time.sleep(0.01)
    yield server, s
    server.server.should_exit = True
    thread.join(10)
    s.source.stop()


def call(url, body=None, headers=None, data=None):
    """(status, JSON answer) of one request."""
    raw = data if data is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=raw, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bad_requests_get_a_4xx_and_change_nothing_on_disk(served, tmp_path):
    server, _ = served
    base = server.url
    status, first = call(base + "api/next?labeler=ana")
    assert status == 200
    pid = first["pair"]["pair_id"]
    assert call(base + "api/label", {"pair_id": pid, "choice": "left", "labeler": "ana"})[0] == 200
    before = (tmp_path / "h.jsonl").read_bytes()
    cases = {
        "unknown pair": ({"pair_id": "0" * 16, "choice": "left", "labeler": "ana"}, 404),
        "labeled twice": ({"pair_id": pid, "choice": "right", "labeler": "ana"}, 409),
        "a path as pair id": ({"pair_id": "../../etc/passwd", "choice": "left", "labeler": "ana"}, 422),
        "unknown choice": ({"pair_id": pid, "choice": "both", "labeler": "ana"}, 422),
        "extra field": ({"pair_id": pid, "choice": "left", "labeler": "ana", "file": "/tmp/x"}, 422),
        "bad labeler": ({"pair_id": pid, "choice": "left", "labeler": "a/b"}, 422),
    }
    for name, (body, want) in cases.items():
        status, answer = call(base + "api/label", body)
        assert status == want, (name, answer)
        assert "detail" in answer
    huge = json.dumps({"pair_id": pid, "choice": "left", "labeler": "ana", "pad": "x" * 100_000}).encode()
    assert call(base + "api/label", data=huge)[0] == 413
    assert call(base + "api/undo", {"labeler": "nobody"})[0] == 409
    assert (tmp_path / "h.jsonl").read_bytes() == before


@pytest.mark.parametrize("served", ["0.0.0.0"], indirect=True)
def test_another_host_needs_the_printed_token(served, tmp_path):
    server, _ = served
    assert "?token=" in server.url
    token = server.url.split("?token=")[1]
    port = server.url.split(":")[2].split("/")[0]
    base = f"http://127.0.0.1:{port}/"
    assert call(base + "api/progress")[0] == 403
    assert call(base + "api/progress", headers={"X-Token": "wrong"})[0] == 403
    status, pair = call(base + f"api/next?labeler=ana&token={token}")
    assert status == 200
    body = {"pair_id": pair["pair"]["pair_id"], "choice": "left", "labeler": "ana"}
    assert call(base + "api/label", body, headers={"X-Token": "wrong"})[0] == 403
    assert (tmp_path / "h.jsonl").read_bytes() == b""
    assert call(base + "api/label", body, headers={"X-Token": token})[0] == 200


# The command, with the page in a real browser.
@pytest.mark.integration
def test_label_undo_kill_resume_in_the_browser(run_copy, browser, artifacts):
    server = start_label(run_copy)
    page = browser.new_page()
    console = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    pressed = []
    try:
        page.goto(server.url)
        for _ in range(10):
            pair = wait_for_pair(page)
            key = choice_key(length, pair)
            press_and_wait(page, key, pair["pair_id"])
            pressed.append((pair, key))
        on_screen = shown_pair(page)
        press_and_wait(page, "u", on_screen["pair_id"])  # the last label comes back, as it was shown
        back = shown_pair(page)
        assert back["pair_id"] == pressed[-1][0]["pair_id"] and back["left"] == pressed[-1][0]["left"]
        press_and_wait(page, "3", back["pair_id"])  # relabel it a tie
        assert shown_pair(page)["pair_id"] == on_screen["pair_id"]  # then the pair that was on screen
        page.screenshot(path=str(artifacts / "label-page.png"))
        timings = page.evaluate("() => window.labelTimings")
    finally:
        server.kill()  # SIGKILL mid-way: nothing flushed late, nothing to clean up
    server = start_label(run_copy)
    try:
        page.goto(server.url)
        wait_for_pair(page)
        assert "10 / 100" in page.text_content("#progress")  # 10 labels, one retracted, relabeled a tie
        for _ in range(5):
            pair = wait_for_pair(page)
            press_and_wait(page, choice_key(length, pair), pair["pair_id"])
        progress = page.text_content("#progress")
    finally:
        err = server.stop()  # Ctrl-C: a clean stop
    assert server.proc.returncode == 0, err
    assert "Traceback" not in err and "labels in" in err
    rows = lines(run_copy / "human_preferences.jsonl")
    labels = [r for r in rows if "retracts" not in r]
    retractions = [r for r in rows if "retracts" in r]
    assert len(labels) == 16 and len(retractions) == 1  # 10, the relabel after the undo, 5 more
    assert retractions[0]["retracts"] == pressed[-1][0]["pair_id"]
    for (pair, key), row in zip(pressed, labels):  # row by row: what was on screen and which key
        assert row["pair_id"] == pair["pair_id"] and row["prompt"] == pair["prompt"]
        want = {"1": "left", "2": "right", "3": "tie"}[key]
        assert row["choice"] == want
        assert row["chosen"] == (pair["right"] if want == "right" else pair["left"])
    assert labels[10]["pair_id"] == pressed[-1][0]["pair_id"] and labels[10]["tie"]
    standing = read_log(run_copy / "human_preferences.jsonl")
    assert len(standing.labels) == 15 and standing.decided == 15  # no duplicate: the retracted row is gone
    assert "15 / 100" in progress
    assert not console, console
    print(f"key to next pair: median {sorted(timings)[len(timings) // 2]:.0f} ms, max {max(timings):.0f} ms")
    assert max(timings) < 1000  # a loose guard; the 100 ms target is measured, not timed, in the docs


@pytest.mark.integration
def test_two_pages_label_at_once(run_copy, browser):
    server = start_label(run_copy)
    try:
        pages = [browser.new_page() for _ in range(2)]
        for who, page in zip(("ana", "bo"), pages):
            page.goto(server.url + f"?labeler={who}")
        for _ in range(8):
            shown = [wait_for_pair(p) for p in pages]
            for p in pages:  # both requests in flight before either is waited for
                p.keyboard.press("1")
            for p, before in zip(pages, shown):
                p.wait_for_function("(b) => document.getElementById('pair').dataset.pairId !== b",
                                    arg=before["pair_id"])  # fmt: skip
    finally:
        server.stop()
    rows = lines(run_copy / "human_preferences.jsonl")
    assert len(rows) == 16 and len({r["pair_id"] for r in rows}) == 16
    assert sorted(r["labeler"] for r in rows) == ["ana"] * 8 + ["bo"] * 8


@pytest.mark.integration
def test_simulated_labeler_trains_a_reward_model_that_agrees_with_them(run_copy, browser, artifacts):
    """The loop: 100 labels from a labeler who always prefers the longer reply (the judge drives the keys), then
    `reward --preferences_file` on them: held-out accuracy on the labeler's own held-out labels."""
    server = start_label(run_copy, "--max_new_tokens", "24")
    try:
        done = simulate_labeler(browser.new_page(), server.url, length, 100)
    finally:
        server.stop()
    log = run_copy / "human_preferences.jsonl"
    assert read_log(log).decided == 100
    flags = ["--preferences_file", str(log), "--reward_dir", "human_rm", "--heldout_fraction", "0.3"]
    flags += ["--min_steps", "100"]  # the tiny helpers' 10 steps are too few for 70 pairs
    assert stage("reward", run_copy, *flags) == 0
    report = json.loads((run_copy / "human_rm.json").read_text())
    print(f"held-out accuracy on own labels: {report['heldout_accuracy']:.3f} ({report['heldout_pairs']} pairs); "
          f"latency {done.latency()}")  # fmt: skip
    assert report["heldout_pairs"] >= 20 and report["heldout_accuracy"] >= 0.75
    (artifacts / "simulated-labeler.json").write_text(json.dumps({**report, "latency": done.latency()}, indent=1))


@pytest.mark.integration
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--port", "70000"], "port must be in [0, 65535]"),
        (["--labeler", "a b"], "labeler must be 1-40"),
        (["--repeat_rate", "1"], "repeat_rate must be in [0, 1)"),
        (["--model", "/nonexistent"], "/nonexistent"),
        (["--max_new_tokens", "60"], "lower --max_new_tokens"),  # the tiny model's context is 64
    ],
)
def test_label_bad_input_is_one_line(run_dir, flags, message, capsys):
    assert stage("label", run_dir, *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


@pytest.mark.integration
def test_label_on_a_port_in_use_is_one_line(run_copy, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert stage("label", run_copy, "--port", str(taken.getsockname()[1])) == 2
    err = capsys.readouterr().err
    assert not (run_copy / "human_preferences.jsonl").exists()  # refused before anything was written
    assert err.startswith("error: cannot serve on 127.0.0.1:") and "--port" in err


@pytest.mark.integration
def test_reward_refuses_a_broken_or_empty_label_log(run_dir, tmp_path, capsys):
    log = LabelLog(tmp_path / "h.jsonl")
    log.open()
    log.append(label_row("a" * 16, "p", "L", "R", "skip", "ana", "m", None))
    assert stage("reward", run_dir, "--preferences_file", str(log.path), "--reward_dir", str(tmp_path / "rm")) == 2
    assert "holds no labels yet" in capsys.readouterr().err
    log.append({**label_row("b" * 16, "p", "L", "R", "left", "ana", "m", None), "choice": "both"})
    assert stage("reward", run_dir, "--preferences_file", str(log.path), "--reward_dir", str(tmp_path / "rm")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "row 2: 'choice' is 'both'" in err
    assert not (tmp_path / "rm").exists()
