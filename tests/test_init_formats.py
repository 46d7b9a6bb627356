"""train_rm.py --init from every checkpoint format the README lists: llama2.c .bin (the shared
stories260K) and .pt, a Meta directory, a Hugging Face directory (and .gguf in test_train.py:
test_init_from_a_gguf_file); each trains a few steps, and the trained model starts from the file's
weights (its frozen layers are the file's, bit for bit)."""

import json

import pytest
import torch
from conftest import shared_path, stories_arith

import train_rm
from data.arith.prepare import main as prepare_arith
from model import ModelConfig, Transformer
from nanorm.base.checkpoints import load_transformer
from nanorm.ckpt import load_reward_model

SHAPE = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=32)


@pytest.fixture(scope="module")
def arith(tmp_path_factory):
    d = tmp_path_factory.mktemp("arith")
    meta = prepare_arith(["--out_dir", str(d), "--n_train", "64", "--n_val", "16"])
    return str(d), meta["vocab_size"]


def write(fmt, path, vocab):
    """A random LLaMA of SHAPE saved as fmt under path; -> (what --init takes, the model)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SHAPE, vocab_size=vocab, tie_embeddings=fmt == "llama2c-pt"))
    sd = model.state_dict()
    path.mkdir()
    if fmt == "llama2c-pt":  # llama2.c's train.py: {"model", "model_args"}
        args = {k: SHAPE[k] for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "multiple_of")}
        args |= dict(vocab_size=vocab, hidden_dim=model.config.hidden_dim, max_seq_len=256)
        torch.save({"model": sd, "model_args": args}, path / "ckpt.pt")
        return path / "ckpt.pt", model
    if fmt == "meta":  # params.json + consolidated.00.pth
        params = dict(SHAPE, vocab_size=vocab, norm_eps=1e-5, rope_theta=10000.0)
        (path / "params.json").write_text(json.dumps(params))
        torch.save(sd, path / "consolidated.00.pth")
        return path, model
    transformers = pytest.importorskip("transformers", reason="an HF directory needs transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=model.config.hidden_dim,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path, load_transformer(path)


@pytest.mark.parametrize("fmt", ["llama2c-bin", "llama2c-pt", "meta", "hf"])
def test_train_rm_inits_from_every_format(arith, tmp_path, fmt):
    data, vocab = arith
    if fmt == "llama2c-bin":
        init = shared_path("llama2c", "stories260K", "stories260K.bin")  # a real checkpoint
        base = load_transformer(init)
        data = stories_arith(tmp_path / "tok512", 64, 16)  # in its own vocabulary
    else:
        init, base = write(fmt, tmp_path / fmt, vocab)
    argv = ["--dataset", data, "--out_dir", tmp_path / "out", "--init", init, "--lm_coef", 0]
    argv += ["--max_iters", 2, "--batch_size", 4, "--eval_pairs", 8, "--train_layers", 1]
    argv += ["--cache", "false", "--eval_first", "false"]
    res = train_rm.main([str(a) for a in argv])
    assert 0 <= res["acc"] <= 1
    rm, _ = load_reward_model(tmp_path / "out" / "ckpt.pt")
    frozen = rm.backbone.layers[0].attention.wq.weight  # below the trained top layer
    assert torch.equal(frozen, base.layers[0].attention.wq.weight)
    trained = rm.backbone.layers[-1].attention.wq.weight
    assert not torch.equal(trained, base.layers[-1].attention.wq.weight)
