"""AlphaEdit's preserved-key second moments C_0: one pass stopped at the deepest edited layer vs a full pass per layer.

`key_second_moments` captures the `down_proj` inputs of every edited layer in one forward pass per batch and stops
it at the deepest of them (no layer above, no LM head). The reference below is what it replaced: one complete
forward pass over the preserved texts per edited layer. Same model (a preset's architecture with random weights: the
speed does not depend on them), same texts (random token ids of ~`--text-len` tokens); both must give bitwise-equal
C_0, checked before the timing is printed. Repetitions are interleaved and the median is reported (shared machines).

    .venv/bin/python bench/bench_alphaedit_c0.py [--preset mini] [--layers 1 2] [--texts 400] [--reps 3]
        [--device cpu|cuda]

At scale the saving grows with depth: OLMo-2 1B edits layers 4–8 of 16, so five full passes become one pass
through 9 of 16 layers (~9x fewer layer passes); `--num-layers 16 --layers 4 5 6 7 8` shows it on the mini width.
"""
import argparse, random, statistics, time

import torch
from transformers import Olmo2ForCausalLM
from transformers.utils import logging as hf_logging

from lume_lab.core.config import make_config
from lume_lab.models.lm import olmo2_config
from lume_lab.unlearn.alphaedit import _capture, down_proj, key_second_moments

hf_logging.set_verbosity_error()


class IdTokenizer:
    "Texts are space-separated token ids (what `encode_texts` needs: `__call__` → input_ids, and a pad id)."
    pad_token_id, eos_token_id = 0, 1
    def __call__(self, texts, add_special_tokens=False, **kw):
        return {"input_ids": [[int(t) for t in s.split()] for s in texts]}


@torch.no_grad()
def full_pass_moment(model, tok, texts, layer, batch_size=16, max_length=128):
    "The reference: C_0 of one layer from a complete forward pass per batch."
    from lume_lab.models.ops import encode_texts, lm_inputs, pad_batch, pad_id, to_device
    dev, acc, n, st = next(model.parameters()).device, 0, 0, {}
    with _capture(down_proj(model, layer), st):
        for i in range(0, len(texts), batch_size):
            ids = [t[:max_length] for t in encode_texts(tok, texts[i:i + batch_size], add_eos=False)]
            enc = to_device(pad_batch(ids, pad_id(tok)), dev)
            model(**lm_inputs(enc)); k = st["x"][enc["attention_mask"].bool()].double()
            acc, n = acc + k.T @ k, n + len(k)
    return acc / n, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="mini"); ap.add_argument("--num-layers", type=int, default=None)
    ap.add_argument(
        "--layers", type=int, nargs="+", default=None, help="edited layers (default: AlphaEdit's, L/6 .. L/3)"
    )
    ap.add_argument("--texts", type=int, default=400); ap.add_argument("--text-len", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3); ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    mc = make_config(a.preset).model
    if mc.name_or_path is not None:
        raise SystemExit(
            f"preset {a.preset!r} names a hub model; this benchmark builds a tiny architecture (use --preset mini, "
            "smoke or study)"
        )
    L = a.num_layers or mc.num_layers
    layers = a.layers or list(range(L // 6, max(1, L // 3) + 1))
    if not all(0 <= l < L for l in layers): raise SystemExit(f"--layers must lie in 0..{L - 1}, got {layers}")
    torch.manual_seed(a.seed)
    model = Olmo2ForCausalLM(olmo2_config(
        mc.vocab_size, mc.hidden_size, L, mc.num_heads, mc.intermediate_size, max(mc.max_seq_len, 128),
        pad_token_id=0, eos_token_id=1)).to(a.device).eval()
    rng, tok = random.Random(a.seed), IdTokenizer()
    texts = [
        " ".join(str(rng.randrange(2, mc.vocab_size)) for _ in range(a.text_len + rng.randint(-20, 20)))
        for _ in range(a.texts)
    ]
    one, N = key_second_moments(model, tok, texts, layers)
    same = all(torch.equal(full_pass_moment(model, tok, texts, l)[0], one[l]) for l in layers)
    print(
        f"model: {a.preset} width, {L} layers, edited layers {layers}, on {a.device}, threads "
        f"{torch.get_num_threads()}; {a.texts} texts, {N} keys; C_0 bitwise equal: {same}"
    )
    if not same: raise SystemExit("the one-pass and per-layer C_0 differ: fix before timing")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    times = {"one stopped pass": [], "full pass per layer": []}
    for _ in range(a.reps):
        for name, fn in (("one stopped pass", lambda: key_second_moments(model, tok, texts, layers)),
                         ("full pass per layer", lambda: [full_pass_moment(model, tok, texts, l) for l in layers])):
            sync(); t = time.perf_counter(); fn(); sync(); times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items(): print(f"{k:>20}: {v:7.2f} s (median of {a.reps})")
    print(f"full pass per layer / one stopped pass: {med['full pass per layer'] / med['one stopped pass']:.1f}x")


if __name__ == "__main__":
    main()
