"""What the labeling page talks to, without the web layer: pairs sampled ahead on a background thread
(`PairSource`) and the session that hands them out, records choices in the label log, undoes and repeats
(`LabelSession`). Every method is safe to call from several request threads at once."""

from __future__ import annotations

import queue
import random
import secrets
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .store import LabelLog, agreement, label_row, retraction_row

LABELER = r"^[A-Za-z0-9_.@-]{1,40}$"  # a labeler's name: it goes into every row
AGREEMENT_EVERY = 20  # the page's agreement figure is refreshed after every 20 labels


@dataclass(frozen=True)
class Pair:
    """Two replies to one prompt as the page shows them (left, right). `repeat_of`: the pair id whose replies
    these are again, sides swapped."""

    pair_id: str
    prompt: str
    left: str
    right: str
    model: str
    repeat_of: str | None = None

    def public(self) -> dict[str, Any]:
        """What the page receives (the model's path stays on the server)."""
        return {k: v for k, v in asdict(self).items() if k != "model"}


def new_pair_id() -> str:
    return secrets.token_hex(8)


class PairSource:
    """Pairs of replies from one model, sampled ahead on a daemon thread so the next pair is ready at once.

    `draw(prompts)` returns two replies per prompt, `[a0, b0, a1, b1, ...]`. Identical replies are dropped (no
    choice to make); the sides of the rest are drawn at random, and the log records them (`shown_order`).
    """

    def __init__(
        self,
        draw: Callable[[list[str]], list[str]],
        prompts: list[str],
        model: str,
        ahead: int = 16,
    ) -> None:
        self.draw, self.prompts, self.model = draw, prompts, model
        self.batch = max(1, ahead // 2)
        self.ready: queue.Queue[Pair] = queue.Queue(maxsize=ahead)
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._rng = random.Random(0)
        self._seed = 0
        self._thread = threading.Thread(target=self._fill, name="pair-sampler", daemon=True)

    def start(self, seed: int) -> None:
        """Start sampling, seeded (the session passes the run's seed plus the log's length: a restart draws new
        pairs, the same ones for the same log)."""
        self._rng, self._seed = random.Random(seed), seed
        self._thread.start()

    def _fill(self) -> None:
        torch.manual_seed(self._seed)
        try:
            while not self._stop.is_set():
                prompts = [self._rng.choice(self.prompts) for _ in range(self.batch)]
                texts = self.draw(prompts)
                for i, prompt in enumerate(prompts):
                    a, b = texts[2 * i], texts[2 * i + 1]
                    if a.strip() == b.strip():
                        continue
                    if self._rng.random() < 0.5:
                        a, b = b, a
                    pair = Pair(new_pair_id(), prompt, a, b, self.model)
                    while not self._stop.is_set():
                        try:
                            self.ready.put(pair, timeout=0.2)
                            break
                        except queue.Full:
                            continue
        except BaseException as exc:  # surfaced by `get`: the page then shows the cause instead of waiting forever
            self.failure = exc

    def get(self, timeout: float = 30.0) -> Pair:
        """The next pair; a failure of the sampler (or none within `timeout`) is raised here."""
        waited = 0.0
        while True:
            if self.failure is not None:
                raise RuntimeError(f"the pair sampler failed: {type(self.failure).__name__}: {self.failure}")
            try:
                return self.ready.get(timeout=0.2)
            except queue.Empty:
                waited += 0.2
                if waited >= timeout:
                    raise TimeoutError(f"no pair sampled within {timeout:.0f} s") from None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)


class LabelError(Exception):
    """A request the session refuses: `status` is its HTTP status (404 unknown pair, 409 conflict)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LabelSession:
    """Hands out pairs, records each choice in the log before answering, takes the last one back on undo, and now
    and then (`repeat_rate`) shows an earlier pair again with the sides swapped. Resumes from the log."""

    def __init__(
        self, log: LabelLog, source: PairSource, target: int = 100, repeat_rate: float = 0.05, seed: int = 0
    ) -> None:
        self.log, self.source, self.target, self.repeat_rate = log, source, target, repeat_rate
        self.state = log.open()
        self.pending: dict[str, Pair] = {}  # handed out, not yet labeled
        self.front: dict[str, list[Pair]] = {}  # per labeler: pairs to show before new ones (after an undo)
        self.repeated = {r["repeat_of"] for r in self.state.labels.values() if r.get("repeat_of")}
        self._rng = random.Random(seed + self.state.rows)
        self._lock = threading.Lock()
        self._agreement = agreement(self.state.labels.values())
        source.start(seed + self.state.rows)

    def progress(self) -> dict[str, Any]:
        same, n = self._agreement
        return {
            "labeled": self.state.decided,
            "target": self.target,
            "agreement": None if n == 0 else {"same": same, "repeats": n, "rate": same / n},
            "done": self.state.decided >= self.target,
        }

    def _repeat(self) -> Pair | None:
        """An earlier left/right label not yet repeated, its replies swapped: or None."""
        if self._rng.random() >= self.repeat_rate:
            return None
        candidates = [
            r
            for pid, r in self.state.labels.items()
            if not (r["tie"] or r["skip"] or r.get("repeat_of")) and pid not in self.repeated
        ]
        if not candidates:
            return None
        r = self._rng.choice(candidates)
        left_was_chosen = r["shown_order"][0] == "chosen"
        left, right = (r["rejected"], r["chosen"]) if left_was_chosen else (r["chosen"], r["rejected"])
        self.repeated.add(r["pair_id"])
        return Pair(new_pair_id(), r["prompt"], left, right, r["model"], repeat_of=r["pair_id"])

    def next_pair(self, labeler: str) -> Pair:
        with self._lock:
            waiting = self.front.get(labeler)
            pair = waiting.pop() if waiting else self._repeat()
        if pair is None:
            pair = self.source.get()  # outside the lock: another tab may label meanwhile
        with self._lock:
            self.pending[pair.pair_id] = pair
        return pair

    def label(self, pair_id: str, choice: str, labeler: str) -> None:
        """Append the choice to the log (flushed and fsynced) and mark the pair labeled."""
        with self._lock:
            if pair_id in self.state.labels:
                raise LabelError(409, f"pair {pair_id} is already labeled; press u to undo it first")
            pair = self.pending.get(pair_id)
            if pair is None:
                raise LabelError(404, f"no pair {pair_id} is waiting for a label; reload the page")
            row = label_row(pair_id, pair.prompt, pair.left, pair.right, choice, labeler, pair.model, pair.repeat_of)
            self.log.append(row)
            del self.pending[pair_id]
            self.state.apply(row)
            if self.state.decided % AGREEMENT_EVERY == 0:
                self._agreement = agreement(self.state.labels.values())

    def undo(self, labeler: str, current: str | None) -> Pair:
        """Retract `labeler`'s last standing label (a retraction row is appended) and return its pair to show
        again; the pair on screen (`current`) comes back after it."""
        with self._lock:
            mine = self.state.by_labeler.get(labeler) or []
            if not mine:
                raise LabelError(409, f"{labeler} has no label to undo")
            row = self.state.labels[mine[-1]]
            self.log.append(retraction_row(row["pair_id"], labeler))
            self.state.apply({"retracts": row["pair_id"]})
            on_screen = self.pending.get(current or "")
            if on_screen is not None:
                self.front.setdefault(labeler, []).append(on_screen)
            left, right = (row["chosen"], row["rejected"])
            if row["shown_order"][0] == "rejected":
                left, right = right, left
            pair = Pair(row["pair_id"], row["prompt"], left, right, row["model"], row.get("repeat_of"))
            self.pending[pair.pair_id] = pair
            self._agreement = agreement(self.state.labels.values())
            return pair
