"""Language-model parts on tiny models: BT loss, last-token scores, tokenizer, SFT, reward model, round trips."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhf_toy.lm.algorithms.reward import (
    RewardConfig,
    bradley_terry_loss,
    pairwise_accuracy,
    scorer,
    train_reward_model,
)
from rlhf_toy.lm.algorithms.sft import SFTConfig, encode_pairs, train_sft
from rlhf_toy.lm.data.tasks import helpdesk_task
from rlhf_toy.lm.models.causal_lm import ModelConfig, new_causal_lm, position_ids
from rlhf_toy.lm.models.chat import EOS, PAD, encode_prompts, pad_sequences, prompt_text, train_tokenizer
from rlhf_toy.lm.models.reward_model import MIN_NORM_STD, raw_scores, score_texts, set_normalization
from rlhf_toy.lm.pipeline.evaluate import format_gain, paired_gain

pytestmark = pytest.mark.integration  # trains or loads models, or runs whole commands

TINY = ModelConfig(n_layer=2, n_embd=32, n_head=2, n_positions=64)


@pytest.fixture(scope="module")
def task():
    return helpdesk_task(n_train=3000, n_eval=200)


@pytest.fixture(scope="module")
def tok(task):
    return train_tokenizer([p for p, _ in task.train] + [r for _, r in task.train], 500)


def test_bradley_terry_loss_by_hand():
    rc, rr = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    expected = (-math.log(1 / (1 + math.exp(-1))) - math.log(1 / (1 + math.exp(2)))) / 2
    assert bradley_terry_loss(rc, rr).item() == pytest.approx(expected, rel=1e-6)
    p = torch.tensor([0.75, 0.75])
    s = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    soft = (-(0.75 * math.log(s(1)) + 0.25 * math.log(s(-1))) - (0.75 * math.log(s(-2)) + 0.25 * math.log(s(2)))) / 2
    assert bradley_terry_loss(rc, rr, p).item() == pytest.approx(soft, rel=1e-6)


def test_tokenizer_round_trip_and_distinct_pad_eos(tok, tmp_path):
    assert tok.pad_token == PAD and tok.eos_token == EOS and tok.pad_token_id != tok.eos_token_id
    text = "Happy to help! Try restarting your printer. Bye."
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("Ünïcode ☃ works too")) == "Ünïcode ☃ works too"  # byte-level: no unknowns
    full = tok.encode(prompt_text("My printer won't start.") + "Sure. Bye." + EOS)
    assert full == tok.encode(prompt_text("My printer won't start.")) + tok.encode("Sure. Bye.") + [tok.eos_token_id]
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.encode(text) == tok.encode(text) and loaded.pad_token_id == tok.pad_token_id


def test_left_padding_with_position_ids_matches_unpadded(tok):
    model = new_causal_lm(tok, TINY)
    prompts = ["My printer won't start.", "Hi, my old television in the office keeps restarting."]
    ids, mask = pad_sequences(encode_prompts(tok, prompts), tok.pad_token_id, "left")
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[0, -1]
        alone = model(input_ids=torch.tensor([encode_prompts(tok, prompts[:1])[0]])).logits[0, -1]
    torch.testing.assert_close(padded, alone, atol=1e-4, rtol=1e-4)


def tiny_reward_model(tok):
    from transformers import GPT2Config, GPT2ForSequenceClassification

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        num_labels=1,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=tok.pad_token_id,
    )
    return GPT2ForSequenceClassification(cfg).eval()


def test_score_is_read_at_the_last_real_token_with_padding_on_either_side(tok):
    rm = tiny_reward_model(tok)
    seqs = [tok.encode("Sure. Bye.") + [tok.eos_token_id], tok.encode("Happy to help! Good luck!") + [tok.eos_token_id]]
    with torch.no_grad():
        alone = torch.stack(
            [raw_scores(rm, torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long))[0] for s in seqs]
        )
        left = raw_scores(rm, *pad_sequences(seqs, tok.pad_token_id, "left"))
        right = raw_scores(rm, *pad_sequences(seqs, tok.pad_token_id, "right"))
    torch.testing.assert_close(left, alone, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(right, alone, atol=1e-4, rtol=1e-4)


def test_reward_model_learns_a_simple_synthetic_preference(tok):
    """Chosen replies are warm, rejected rude, on random prompts; held-out pairwise accuracy >= 0.8."""
    import random

    rng = random.Random(0)
    warm, rude = ["Happy to help!", "Good luck!", "Hope this helps!"], ["Whatever.", "Deal with it.", "Ugh."]
    prompts = [f"My {t} won't start." for t in ["printer", "laptop", "router", "phone", "oven", "lamp"]]

    def pair():
        return rng.choice(prompts), f"{rng.choice(warm)} Bye.", f"{rng.choice(rude)} Bye."

    train = [pair() for _ in range(400)]
    rm = tiny_reward_model(tok)
    train_reward_model(
        rm,
        tok,
        {"prompt": [t[0] for t in train], "chosen": [t[1] for t in train], "rejected": [t[2] for t in train]},
        RewardConfig(epochs=2, batch_size=32, learning_rate=3e-3),
        seed=0,
        progress=False,
    )
    test = [pair() for _ in range(100)]
    acc = pairwise_accuracy(scorer(rm, tok), [t[0] for t in test], [[t[1], t[2]] for t in test], [[1.0, 0.0]] * 100)
    assert acc["accuracy"] >= 0.8


def test_sft_lowers_held_out_loss_and_round_trips(task, tok, tmp_path):
    model = new_causal_lm(tok, TINY)
    train_ids, _ = encode_pairs(tok, task.train, 64)
    eval_ids, _ = encode_pairs(tok, task.eval, 64)
    hist = train_sft(
        model, tok, train_ids, eval_ids, SFTConfig(epochs=2, batch_size=32, learning_rate=1e-2), 0, progress=False
    )
    assert hist["eval_loss"][-1] < 0.6 * hist["eval_loss"][0]
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([train_ids[0][0] + train_ids[0][1]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert again.config.resid_pdrop == 0.0 and again.config.pad_token_id == tok.pad_token_id


def test_a_tiny_score_spread_is_not_blown_up_by_normalization(tok):
    rm = tiny_reward_model(tok)  # untrained: its scores differ by about 0.01
    prompts, responses = ["My printer won't start."] * 3, ["Sure. Bye.", "Ugh. Bye.", "Happy to help!"]
    raw = score_texts(rm, tok, prompts, responses)
    mean, std = set_normalization(rm, tok, prompts, responses)
    assert raw.std() < MIN_NORM_STD and std == 1.0  # only the mean is removed: no 100x larger rewards
    torch.testing.assert_close(score_texts(rm, tok, prompts, responses), raw - mean)


def test_reward_model_round_trip_keeps_normalization(tok, tmp_path):
    rm = tiny_reward_model(tok)
    with torch.no_grad():
        rm.score.weight.mul_(100.0)  # a spread of scores like a trained model's, so that normalization scales
    prompts, responses = ["My printer won't start."] * 3, ["Sure. Bye.", "Ugh. Bye.", "Happy to help!"]
    mean, std = set_normalization(rm, tok, prompts, responses)
    s = score_texts(rm, tok, prompts, responses)
    assert abs(s.mean()) < 1e-5 and abs(s.std() - 1) < 1e-4
    rm.save_pretrained(tmp_path)
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert again.config.reward_mean == pytest.approx(mean) and again.config.reward_std == pytest.approx(std)
    torch.testing.assert_close(score_texts(again, tok, prompts, responses), s)


def test_paired_gain_matches_a_naive_computation_and_tolerates_identical_scores():
    ref = {"gold_scores": [0.0, 1.0, -1.0, 0.5]}
    row = {"gold_scores": [0.5, 1.0, 0.0, 0.5]}
    gain, se = paired_gain(row, ref)
    diffs = [0.5, 0.0, 1.0, 0.0]
    mean = sum(diffs) / 4
    naive_se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3 / 4)
    assert gain == pytest.approx(mean) and se == pytest.approx(naive_se)
    assert format_gain(gain, se) == f"+{mean:.3f} ± {naive_se:.3f} ({mean / naive_se:.1f} s.e.)"
    # a model that scores exactly like the reference (tiny random models do) has zero error: no ratio, no crash
    gain, se = paired_gain(ref, ref)
    assert (gain, se) == (0.0, 0.0) and format_gain(gain, se) == "+0.000 ± 0.000"
