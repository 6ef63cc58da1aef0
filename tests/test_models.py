"""Cross-module and bad-input tests of lume_lab.models (tokenizer + lm):
HF round trips, determinism, resumable pretraining."""
import hashlib, json, subprocess, sys
from pathlib import Path

import pytest, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from lume_lab.core.config import ConfigError, ModelConfig, PretrainConfig
from lume_lab.models.lm import build_model, latest_checkpoint, load_model, pretrain, save_model
from lume_lab.models.tokenizer import train_tokenizer

CORPUS = [f"Question: What is the phone number of Ada {i}?\nAnswer: 555-{1000 + 37 * i}" for i in range(40)]
CORPUS += [f"The capital of country {i} is city {i * 7 % 13}." for i in range(40)]
TINY = ModelConfig(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_seq_len=64)
PCFG = PretrainConfig(steps=10, batch_size=4, seq_len=16, lr=3e-3, warmup_steps=2, checkpoint_every=3)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    "Tiny models run ~20x faster single-threaded on a loaded 2-core box; restore the setting afterwards."
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS, vocab_size=320)


def weights(model): return {k: v.detach().clone() for k, v in model.state_dict().items()}
def all_equal(a, b): return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tokenizer_identical_across_processes(tmp_path, tok):
    "Same texts -> bitwise identical tokenizer.json, also in a fresh interpreter (Rust hash seeds differ per process)."
    train_tokenizer(CORPUS, 320, out_dir=tmp_path / "here")
    (tmp_path / "corpus.json").write_text(json.dumps(CORPUS))
    code = ("import json, sys; from lume_lab.models.tokenizer import train_tokenizer;"
            "train_tokenizer(json.load(open(sys.argv[1])), 320, out_dir=sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "corpus.json"), str(tmp_path / "there")], check=True)
    h = [hashlib.sha256((tmp_path / d / "tokenizer.json").read_bytes()).hexdigest() for d in ("here", "there")]
    assert h[0] == h[1]


def test_checkpoint_loads_with_plain_transformers(tmp_path, tok):
    "A lume_lab checkpoint is a plain HF checkpoint: Auto classes load it and give identical logits and ids."
    model = build_model(TINY, tok, seed=0)
    save_model(model, tok, tmp_path)
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path)
    assert type(hf_model).__name__ == "Olmo2ForCausalLM"
    assert (hf_tok.eos_token, hf_tok.pad_token) == ("<|endoftext|>", "<|pad|>")
    ids = hf_tok(CORPUS[:3], return_tensors="pt", padding=True)
    assert torch.equal(ids["input_ids"], tok(CORPUS[:3], return_tensors="pt", padding=True)["input_ids"])
    with torch.no_grad():
        assert torch.equal(hf_model(**ids).logits, model(**ids).logits)


def test_load_model_on_saved_tiny_dir(tmp_path, tok):
    model = build_model(TINY, tok, seed=1)
    save_model(model, tok, tmp_path)
    m, t = load_model(tmp_path, device="cpu")
    assert not m.training and t.pad_token_id == tok.pad_token_id
    assert all_equal(weights(m), weights(model))
    m16, _ = load_model(str(tmp_path), dtype="bfloat16", device="cpu")
    assert m16.model.embed_tokens.weight.dtype == torch.bfloat16


def test_load_model_sets_missing_pad_token(tmp_path, tok):
    "A checkpoint whose tokenizer has no pad token (many HF models) gets EOS as pad."
    save_model(build_model(TINY, tok, seed=0), tok, tmp_path)
    no_pad = AutoTokenizer.from_pretrained(tmp_path); no_pad.pad_token = None
    no_pad.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    _, t = load_model(tmp_path, device="cpu")
    assert t.pad_token == t.eos_token == "<|endoftext|>"


def test_load_model_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"): load_model("/no/such/dir")
    with pytest.raises(FileNotFoundError, match="no config.json"): load_model(tmp_path)
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="is a file"): load_model(tmp_path / "f.bin")
    with pytest.raises(ConfigError, match="dtype must be one of"): load_model(tmp_path, dtype="int8")


def test_same_seed_same_weights(tok):
    runs = []
    for seed in (0, 0, 1):
        m = build_model(TINY, tok, seed=0)
        pretrain(m, tok, CORPUS, PCFG, seed=seed)
        runs.append(weights(m))
    assert all_equal(runs[0], runs[1])
    assert not all_equal(runs[0], runs[2])  # the pretraining seed changes the data order


def test_resume_is_bitwise_identical(tmp_path, tok):
    "10 steps straight == 6 steps, crash (with debris of a half-written checkpoint), resume to 10."
    ref = build_model(TINY, tok, seed=0)
    ref_log = pretrain(ref, tok, CORPUS, PCFG, seed=0)

    def crash(row):
        if row["step"] == 7:
            raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        pretrain(build_model(TINY, tok, seed=0), tok, CORPUS, PCFG, seed=0, work_dir=tmp_path, callback=crash)
    assert latest_checkpoint(tmp_path).name == "checkpoint-0000006"
    # a crash while writing the step-9 checkpoint: temp dir with a partial file, never picked up
    (tmp_path / ".tmp-checkpoint-abc").mkdir()
    (tmp_path / ".tmp-checkpoint-abc" / "model.safetensors").write_bytes(b"partial")
    (tmp_path / "checkpoint-0000009").mkdir()  # no state.json: not a complete checkpoint
    assert latest_checkpoint(tmp_path).name == "checkpoint-0000006"

    resumed, ran = build_model(TINY, tok, seed=0), []
    log = pretrain(resumed, tok, CORPUS, PCFG, seed=0, work_dir=tmp_path, callback=lambda row: ran.append(row["step"]))
    assert ran == [7, 8, 9, 10]  # it really resumed after step 6
    assert all_equal(weights(resumed), weights(ref))
    assert log.step.tolist() == list(range(1, 11)) and log.loss.tolist() == ref_log.loss.tolist()
    assert not (tmp_path / ".tmp-checkpoint-abc").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-0000010"]

    # a finished run resumes at its last step: nothing to train, same weights, same log
    again = build_model(TINY, tok, seed=5)
    log2 = pretrain(again, tok, CORPUS, PCFG, seed=0, work_dir=tmp_path)
    assert all_equal(weights(again), weights(ref)) and log2.equals(log)


def test_resume_refuses_a_different_run(tmp_path, tok):
    pretrain(
        build_model(TINY, tok, seed=0), tok, CORPUS,
        PretrainConfig(steps=3, batch_size=4, seq_len=16, warmup_steps=1, checkpoint_every=3), seed=0, work_dir=tmp_path
    )
    other = PretrainConfig(steps=3, batch_size=4, seq_len=16, warmup_steps=1, checkpoint_every=3, lr=1e-3)
    with pytest.raises(ValueError, match=r"different run \(lr: 0.003 != 0.001\)"):
        pretrain(build_model(TINY, tok, seed=0), tok, CORPUS, other, seed=0, work_dir=tmp_path)


def test_pretrain_bad_input(tok):
    m = build_model(TINY, tok, seed=0)
    with pytest.raises(ConfigError, match="pretrain.steps must be a positive int"):
        pretrain(m, tok, CORPUS, PretrainConfig(steps=0), seed=0)
    with pytest.raises(ConfigError, match="pretrain.lr must be a positive finite float, got 0"):
        pretrain(m, tok, CORPUS, PretrainConfig(lr=0), seed=0)
    with pytest.raises(ValueError, match="fewer than one block"):
        pretrain(m, tok, ["hi"], PretrainConfig(seq_len=32), seed=0)
    with pytest.raises(ValueError, match="got a single str"):
        pretrain(m, tok, "just one string", PCFG, seed=0)
    with pytest.raises(ConfigError, match="exceeds the model's max_position_embeddings"):
        pretrain(m, tok, CORPUS, PretrainConfig(seq_len=128), seed=0)
    with pytest.raises(ValueError, match="keep_checkpoints must be an int >= 1"):
        pretrain(m, tok, CORPUS, PCFG, seed=0, keep_checkpoints=0)


def test_bad_model_and_tokenizer_config(tok):
    with pytest.raises(ConfigError, match="divisible by model.num_heads"):
        build_model(ModelConfig(hidden_size=30, num_heads=4), tok, 0)
    with pytest.raises(ConfigError, match="model.num_layers must be a positive int"):
        build_model(ModelConfig(num_layers=0), tok, 0)
    with pytest.raises(ValueError, match="vocab_size must be an int >= 259"): train_tokenizer(CORPUS, 200)
