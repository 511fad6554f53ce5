"""What the TRL peer runners share: an offline, thread-limited environment, and the tiny BPE tokenizer and GPT-2
config they build from nothing. Benchmark harness, not product code.

`configure(threads)` must run before torch / transformers are imported (thread counts are read at import), so
this module imports them only inside functions.
"""

import os
import sys

WORDS = (
    "the a one my your our this that some every cat dog bird fish tree river hill cloud stone light "
    "house road city story song game book letter garden ship train star moon sun rain wind snow "
    "red blue green small big old new quiet bright dark happy sad fast slow warm cold "
    "runs walks sees finds makes takes gives tells writes reads sings plays builds opens closes "
    "and but so then because while when where why how what who please write tell describe explain"
).split()


def add_common_args(p):
    """The flags both runners take: budget, reply length, the tiny GPT-2's size, threads, seed, logs."""
    p.add_argument("--episodes", type=int, default=512, help="sampled replies in all")
    p.add_argument("--batch-size", type=int, default=64, help="replies per rollout (generation) batch")
    p.add_argument("--response-length", type=int, default=24)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-positions", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=512, help="BPE target vocab size")
    p.add_argument(
        "--tokenizer-dir",
        default=None,
        help="tiny models: a saved tokenizer to use instead of training a BPE (scripts/bench_rlhf.py passes "
        "rlhf-toy's, so that both sides run on the same token ids)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="keep transformers/TRL logs")
    p.add_argument(
        "--count-flops",
        action="store_true",
        help="count the run's matrix-multiply FLOPs (torch's FlopCounterMode; slower, so a short run: one update)",
    )


def configure(threads):
    """Offline, no trackers, `threads` torch/OMP/MKL threads (set before torch is imported)."""
    for k, v in {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_DISABLED": "true",
        "WANDB_MODE": "disabled",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }.items():
        os.environ[k] = v


def cpu_run_args(seed):
    """The TRL trainer arguments every runner shares: CPU, no trackers, no checkpoints, no progress bars, a log line
    per optimizer step, the data loaded in the main process."""
    return dict(
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
        use_cpu=True,
        dataloader_num_workers=0,
    )


def quiet_libraries(verbose, category=FutureWarning):
    """transformers' logs and progress bars off, warnings of `category` ignored (unless `verbose`)."""
    import warnings

    import transformers

    if not verbose:
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        warnings.filterwarnings("ignore", category=category)


def pretrained_tokenizer(model_dir):
    """The directory's tokenizer, left padding, EOS as PAD where it has none (Llama-style)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def scalar_head_model(model_dir, tokenizer):
    """The directory's trunk with a fresh scalar head (a reward or value model), padding with `tokenizer`'s PAD."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def flop_counter(on):
    """torch's `FlopCounterMode` (every matrix multiply run inside it, forward and backward) when `on`, else a
    context that counts nothing and gives None. The CPU's fused attention kernel has no formula there: both
    sides' counts leave attention's products out alike."""
    import contextlib

    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False) if on else contextlib.nullcontext()


def gflops(counter):
    """The FLOPs a `flop_counter` counted, in GFLOPs (None when it counted nothing)."""
    return None if counter is None else counter.get_total_flops() / 1e9


def logger(prefix):
    def log(msg):
        print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)

    return log


def make_corpus(rng, n_lines=4000):
    lines = []
    for _ in range(n_lines):
        k = rng.randint(3, 14)
        lines.append(" ".join(rng.choice(WORDS) for _ in range(k)) + rng.choice([".", "?", "!", ","]))
    return lines


def build_tokenizer(out_dir, rng, vocab_size, extra_lines=()):
    """A byte-level BPE with [PAD] (distinct from EOS), [BOS], [EOS], left padding, trained on a generated corpus
    (plus `extra_lines`, e.g. the benchmark's prompts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["[PAD]", "[BOS]", "[EOS]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_corpus(rng) + list(extra_lines), trainer=trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        padding_side="left",
    )
    hf_tok.save_pretrained(out_dir)
    return PreTrainedTokenizerFast.from_pretrained(out_dir, padding_side="left")


def tiny_tokenizer(out_dir, rng, a, extra_lines=()):
    """The tiny models' tokenizer: the one saved in `--tokenizer-dir`, or else a BPE of `--vocab-size` trained here
    (`build_tokenizer`)."""
    if a.tokenizer_dir:
        return pretrained_tokenizer(a.tokenizer_dir)
    return build_tokenizer(out_dir, rng, a.vocab_size, extra_lines)


def tiny_gpt2_config(tokenizer, n_positions, n_embd, n_layer, n_head):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=1,
    )


def peak_rss_mb():
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
