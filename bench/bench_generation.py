"""Greedy generation with length-sorted batches (`models.ops.greedy_generate`) vs the same batches in the prompts'
order.

Extraction, evaluation, REMIND's ROUGE-L baseline and the resurfacing attack all generate through `greedy_generate`;
the attack alone asks 40 (mini) to 200 (default) prompts per forget profile, of 14 to 107 tokens on mini. Left padding
to the longest prompt of a batch wastes compute on mixed lengths; sorting the prompts by length first does not.
Same model (a preset's architecture, random weights, or a run's instruction-tuned model with `--run`), same prompts
(random ids of lengths drawn uniformly from `--min-len`..`--max-len`), same batch size. Both paths must give the same
answers; the script checks it before timing. Repetitions are interleaved and the median is reported.

    .venv/bin/python bench/bench_generation.py [--preset mini] [--run RUN_ID] [--prompts 640] [--batch 64]
        [--reps 3] [--device cpu|cuda]

Goal: sorted / prompt-order throughput >= 1.3x on mini's attack prompts.
"""
import argparse, random, statistics, time

import torch
from transformers import Olmo2ForCausalLM
from transformers.utils import logging as hf_logging

from lume_lab.core.config import make_config
from lume_lab.models.lm import olmo2_config
from lume_lab.models.ops import greedy_generate

hf_logging.set_verbosity_error()


class _IdTok:
    "A tokenizer stand-in whose text is the space-joined ids (so both paths see exactly the same prompts)."
    pad_token_id, eos_token_id, bos_token_id = 0, 1, None
    def __call__(self, text, add_special_tokens=False): return {"input_ids": [int(t) for t in text.split()]}
    def decode(self, ids, skip_special_tokens=True): return " ".join(map(str, ids))


def prompt_order(model, tok, prompts, max_new_tokens, batch_size):
    """The generator before sorting: the same batches in the prompts' order.
    One `greedy_generate` call per batch, so each batch pads to its own longest prompt."""
    return [g["text"] for s in range(0, len(prompts), batch_size)
            for g in greedy_generate(model, tok, prompts[s:s + batch_size], max_new_tokens, batch_size)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--run", default=None, help="a run id: use its instruct_masked model and real attack prompts")
    ap.add_argument("--prompts", type=int, default=640)
    ap.add_argument("--min-len", type=int, default=14)
    ap.add_argument("--max-len", type=int, default=107)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    if a.run:  # the real thing: a run's model and its resurfacing prompts of the first forget field
        from lume_lab.core.store import open_run
        from lume_lab.pipeline.stages.resurface import attempt_rows
        from lume_lab.pipeline.stages.base import load_stage_model
        from lume_lab.pipeline.stages.unlearn import stage_forget_fields

        store = open_run(a.run)
        model, tok = load_stage_model(store, "instruct_masked")
        rows = attempt_rows(store, stage_forget_fields(store)[0])[0]
        prompts, what = ([r["prompt"] for r in rows][:a.prompts],
                         f"run {a.run!r}: instruct_masked, its resurfacing prompts")
        enc_tok = tok
    else:
        mc = make_config(a.preset).model
        if mc.name_or_path is not None:
            raise SystemExit(f"preset {a.preset!r} names a hub model; use --preset mini or smoke, or --run")
        torch.manual_seed(a.seed)
        model = Olmo2ForCausalLM(
            olmo2_config(
                mc.vocab_size, mc.hidden_size, mc.num_layers, mc.num_heads, mc.intermediate_size, mc.max_seq_len,
                pad_token_id=0, eos_token_id=1)
        )
        rng = random.Random(a.seed)
        prompts = [
            " ".join(str(rng.randrange(4, mc.vocab_size)) for _ in range(rng.randint(a.min_len, a.max_len)))
            for _ in range(a.prompts)
        ]
        what, enc_tok = (f"{a.preset} architecture, random weights, random prompts of {a.min_len}-{a.max_len} tokens",
                         _IdTok())
    model = model.to(a.device).eval()
    sorted_path = lambda: [g["text"] for g in greedy_generate(model, enc_tok, prompts, a.new_tokens, a.batch)]
    ordered_path = lambda: prompt_order(model, enc_tok, prompts, a.new_tokens, a.batch)
    same = sum(x == y for x, y in zip(sorted_path(), ordered_path()))
    print(
        f"{what}; {len(prompts)} prompts, batch {a.batch}, ≤ {a.new_tokens} new tokens, {a.device}, threads "
        f"{torch.get_num_threads()}; identical answers: {same} / {len(prompts)}"
    )
    if same < len(prompts):
        print(
            "note: padding changes float rounding, which can flip a near-tie argmax; the paths are not bitwise "
            "equal here"
        )
    times = {"sorted": [], "prompt order": []}
    for _ in range(a.reps):
        for name, fn in (("sorted", sorted_path), ("prompt order", ordered_path)):
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:>13}: {v:7.2f} s  ({len(prompts) / v:7.1f} prompts/s)")
    print(f"sorted / prompt-order throughput: {med['prompt order'] / med['sorted']:.2f}x (goal >= 1.3x)")


if __name__ == "__main__":
    main()
