"""Teacher-forced answer statistics and an unlearning loss step with the LM head over every position against over the
answer span only (`models.ops.answer_span_logits`, inside `metrics.memorization.answer_token_stats` and
`models.ops.sequence_logprob`).

Every teacher-forced score (EM, Prob, answer NLL, the MIA statistics, each trajectory point) reads only the logits that
predict answer tokens, but a full forward computes a vocabulary-wide row at every position: SmolLM2's head (49,152 ×
576) is about a fifth of its forward, and the `(B, T, V)` logits are hundreds of megabytes per batch. Left-padded, every
row ends with its answer, so transformers' `logits_to_keep` can ask for the answer span alone. This bench scores the
same rows both ways on a run's testbed model, in one process, alternating, and prints the ratio and the largest
difference in a token's log-probability (the two must give the same rows); then the same for one forward and backward
of the per-example answer NLL on a batch of 16 (the unlearning losses' term: `batch_nll` on `collate_pairs`' batches,
left-padded, against right-padded batches with every position's logits).

    .venv/bin/python bench/bench_answer_logits.py RUN_DIR [--field phone_number] [--rows 96] [--reps 3]

RUN_DIR: a run with `testbed/` and `instruct_masked/` (e.g. runs/smollm2-paper/seed=0).
"""
import argparse, time
from pathlib import Path

import torch


class FullLogits(torch.nn.Module):
    "The model without `logits_to_keep` in its signature: every position's logits, as before the span was cut."
    def __init__(self, model):
        super().__init__(); self.model, self.config = model, model.config
    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--field", default="phone_number")
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    from datasets import load_from_disk
    from lume_lab.metrics.memorization import answer_token_stats
    from lume_lab.models.lm import load_model

    rows = [dict(r) for r in load_from_disk(str(a.run / "testbed" / "splits"))[f"forget_{a.field}"]][: a.rows]
    model, tok = load_model(str(a.run / "instruct_masked" / "model"), device="cpu")
    full = FullLogits(model)
    times = {"every position": [], "answer span": []}
    for _ in range(a.reps):
        t = time.perf_counter(); s_full = answer_token_stats(full, tok, rows, 16, padding_side="right")
        times["every position"].append(time.perf_counter() - t)
        t = time.perf_counter(); s_span = answer_token_stats(model, tok, rows, 16)
        times["answer span"].append(time.perf_counter() - t)
    dlogp = max(float((x["logprob"] - y["logprob"]).abs().max()) for x, y in zip(s_full, s_span))
    same_argmax = all(torch.equal(x["correct"], y["correct"]) for x, y in zip(s_full, s_span))
    best = {k: min(v) for k, v in times.items()}
    print(f"{len(rows)} rows of {a.field}; vocabulary {model.config.vocab_size}; "
          f"torch threads {torch.get_num_threads()}")
    print(f"seconds (best of {a.reps}): every position {best['every position']:.2f}, answer span "
          f"{best['answer span']:.2f}; ratio {best['answer span'] / best['every position']:.2f}")
    print(f"largest |Δ log p| of a token {dlogp:.1e}; teacher-forced argmax identical: {same_argmax}")

    from lume_lab.models.ops import batch_nll, collate_qa
    batch = rows[:16]
    right = collate_qa(tok, batch, add_eos=True)                    # the loop's batches before: right-padded
    left = collate_qa(tok, batch, add_eos=True, side="left")        # `unlearn.base.collate_pairs` now
    steps = {"every position": [], "answer span": []}
    losses = {}
    for _ in range(a.reps):
        for name, m, b in (("every position", full, right), ("answer span", model, left)):
            model.zero_grad(); t = time.perf_counter()
            loss = batch_nll(m, b); loss.backward()
            steps[name].append(time.perf_counter() - t); losses[name] = loss.item()
    best = {k: min(v) for k, v in steps.items()}
    print(f"loss step, batch of {len(batch)} (seconds, best of {a.reps}): every position {best['every position']:.2f}, "
          f"answer span {best['answer span']:.2f}; ratio {best['answer span'] / best['every position']:.2f}; "
          f"loss {losses['every position']:.7f} against {losses['answer span']:.7f}")


if __name__ == "__main__":
    main()
