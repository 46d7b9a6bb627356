"""model.py, checkpoints.py and sample.py against known-good references: HF transformers,
llama2.c's published output."""

import json
import struct

import pytest
import torch
from conftest import shared_path, tiny_hf_config

from model import ModelConfig, Transformer
from nanorm.base.checkpoints import load, load_transformer

# karpathy/llama2.c test_all.py expected_stdout: `run stories260K.bin -z tok512.bin -t 0.0 -n 200`
STORIES260K_GREEDY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
    " One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do."
    ' She said, "I want to play with your ball, but I can\'t find it."\n'
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what"
    ' to do."\n'
    "Lily didn't want to help her mom, so she"
)


def tiny(**kw):
    cfg = dict(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, hidden_dim=96, max_seq_len=128
    )
    cfg.update(kw)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**cfg)).eval()


# ---------------------------------------------------------------- Hugging Face parity
HF_CASES = {
    "mha-untied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "gqa-tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "gqa-untied-llama3-rope": dict(
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
}


def make_hf(tmp_path, case, seed=0):
    transformers = pytest.importorskip("transformers", reason="parity tests need transformers")
    pytest.importorskip("safetensors", reason="parity tests need safetensors")
    cfg = tiny_hf_config(num_hidden_layers=3, max_position_embeddings=256, **HF_CASES[case])
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path)
    return hf


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_parity(tmp_path, case):
    hf = make_hf(tmp_path, case)
    ours = load_transformer(tmp_path)
    assert ours.config.tie_embeddings == HF_CASES[case]["tie_word_embeddings"]
    torch.manual_seed(1)
    x = torch.randint(0, 101, (3, 100))  # long enough that llama3 scaling changes the result
    with torch.no_grad():
        ref, got = hf(x).logits, ours(x)
    assert (ref - got).abs().max().item() < 1e-5
    # greedy tokens agree too (generation through our KV cache)
    g_ref = hf.generate(x[:1, :10], max_new_tokens=12, do_sample=False)
    assert torch.equal(ours.generate(x[:1, :10], 12), g_ref)


def test_generation_stops_at_eos_as_transformers_does(tmp_path):
    """A row stops at its first end-of-sequence token: the rest of it is padding, and the loop
    ends when every row has stopped; transformers' generate on the same weights is the reference."""
    hf = make_hf(tmp_path, "gqa-tied")
    ours = load_transformer(tmp_path)
    torch.manual_seed(1)
    x = torch.randint(0, 101, (3, 10))
    free = ours.generate(x, 12)[:, 10:]  # no eos: 12 tokens each
    eos = free[0, 4].item()  # a token row 0 emits at its 5th step: row 0 stops there
    first = [(r == eos).nonzero()[0, 0].item() if (r == eos).any() else 12 for r in free]
    got = ours.generate(x, 12, eos_id=eos, pad_id=100)
    ref = hf.generate(x, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=100)
    assert torch.equal(got, ref)
    assert got.size(1) - 10 == min(max(first) + 1, 12)  # ends once the last row has stopped
    for row, free_row, n in zip(got[:, 10:], free, first, strict=True):
        assert torch.equal(row[: n + 1], free_row[: n + 1])  # the same answer, up to its eos
        assert (row[n + 1 :] == 100).all()  # then padding


def test_hf_formats_sharded_and_bin(tmp_path):
    """The same HF weights as two safetensors shards with an index, and as pytorch_model.bin."""
    from safetensors.torch import save_file

    hf = make_hf(tmp_path / "ref", "gqa-untied-llama3-rope")
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    names = sorted(sd)
    cfg_text = (tmp_path / "ref" / "config.json").read_text()
    shard_dir, bin_dir = tmp_path / "sharded", tmp_path / "bin"
    shard_dir.mkdir(), bin_dir.mkdir()
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, shard_dir / fname)
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.save(sd, bin_dir / "pytorch_model.bin")
    x = torch.randint(0, 101, (2, 33))
    with torch.no_grad():
        ref = hf(x).logits
        for d in (shard_dir, bin_dir):
            (d / "config.json").write_text(cfg_text)
            assert (load_transformer(d)(x) - ref).abs().max().item() < 1e-5


def test_read_checkpoint_keeps_a_sequence_classifier_score_head(tmp_path):
    """An HF LlamaForSequenceClassification directory (no lm_head): load reads its backbone
    with a zero LM head and the same states as HF's, and hands the score over as the reward
    head in the same read, for reward.py."""
    transformers = pytest.importorskip("transformers", reason="parity tests need transformers")
    pytest.importorskip("safetensors", reason="parity tests need safetensors")
    cfg = tiny_hf_config(num_labels=1)
    torch.manual_seed(0)
    hf = transformers.LlamaForSequenceClassification(cfg).eval()
    hf.save_pretrained(tmp_path)
    c = load(tmp_path)
    assert c.head == "score" and torch.equal(c.heads["head.weight"], hf.score.weight)
    assert not c.backbone.output.weight.any()  # the zero LM head a classifier lacks
    ours = c.backbone
    x = torch.randint(0, 101, (2, 17))
    with torch.no_grad():
        ref = hf.model(x).last_hidden_state
        assert (ours.hidden_states(x) - ref).abs().max().item() < 1e-5
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither params.json"):
        load(tmp_path / "empty")


# ---------------------------------------------------------------- llama2.c and Meta formats
def test_stories260k_greedy_matches_llama2c():
    from data.tokenizer import load_tokenizer

    model = load_transformer(shared_path("llama2c", "stories260K", "stories260K.bin"))
    tok = load_tokenizer(shared_path("llama2c", "stories260K", "tok512.bin"))
    # the whole file is read once; every weight is a view into that one buffer
    base = model.tok_embeddings.weight.untyped_storage().data_ptr()
    assert model.layers[3].feed_forward.w2.weight.untyped_storage().data_ptr() == base
    out = model.generate(torch.tensor([[tok.bos_id]]), max_new_tokens=200)[0, 1:].tolist()
    if tok.bos_id in out:  # run.c stops when BOS is sampled
        out = out[: out.index(tok.bos_id)]
    assert tok.decode(out) == STORIES260K_GREEDY


def test_sample_prints_the_stories260k_story(capsys):
    """python -m nanorm.sample, as a function: the same story, byte for byte, after the config line."""
    import nanorm.sample as sample

    shared_path("llama2c", "stories260K", "stories260K.bin")  # its default checkpoint, or a skip
    sample.main([])
    config_line, story = capsys.readouterr().out.split("\n", 1)
    assert config_line.startswith("260,032 parameters; config {'dim': 64, 'n_layers': 5")
    assert story == STORIES260K_GREEDY + "\n"


def test_llama2c_pt_and_meta_roundtrip(tmp_path):
    model = tiny(tie_embeddings=True)
    x = torch.randint(0, 97, (2, 20))
    ref = model(x)
    # llama2.c train.py checkpoint: compiled-model prefixes and its RoPE buffers included
    sd = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    sd["_orig_mod.freqs_cos"] = torch.zeros(1)
    args = dict(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=97,
        hidden_dim=96,
        multiple_of=32,
        norm_eps=1e-5,
        max_seq_len=128,
        dropout=0.0,
    )
    torch.save({"model": sd, "model_args": args, "iter_num": 5}, tmp_path / "ckpt.pt")
    assert torch.allclose(load_transformer(tmp_path / "ckpt.pt")(x), ref, atol=1e-6)
    assert torch.allclose(load_transformer(tmp_path / "ckpt.pt")(x), ref, atol=1e-6)
    # Meta: params.json + consolidated.00.pth; FFN width derived from multiple_of, not stored
    meta = tiny(multiple_of=32, hidden_dim=None, tie_embeddings=False)
    assert meta.config.hidden_dim == 192  # int(2*256/3)=170 rounded up to a multiple of 32
    torch.save(meta.state_dict(), tmp_path / "consolidated.00.pth")
    params = dict(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=-1,
        multiple_of=32,
        norm_eps=1e-5,
        rope_theta=10000.0,
    )
    (tmp_path / "params.json").write_text(json.dumps(params))
    for loaded in (load_transformer(tmp_path), load_transformer(tmp_path)):
        assert torch.allclose(loaded(x), meta(x), atol=1e-6)


@pytest.mark.parametrize(
    "dim,mult,multiple_of,expected",
    [
        (4096, None, 256, 11008),  # Llama 2 7B
        (8192, 1.3, 4096, 28672),  # Llama 2 70B
        (4096, 1.3, 1024, 14336),  # Llama 3 8B
        (2048, 1.5, 256, 8192),  # Llama 3.2 1B
    ],
)
def test_ffn_width_matches_published_llama_sizes(dim, mult, multiple_of, expected):
    cfg = ModelConfig(dim=dim, n_heads=32, ffn_dim_multiplier=mult, multiple_of=multiple_of)
    assert cfg.hidden_dim == expected


# ---------------------------------------------------------------- padding and the KV cache
def test_padding_invariance():
    model = tiny()
    torch.manual_seed(2)
    seqs = [torch.randint(0, 97, (n,)) for n in (7, 12, 3)]
    alone = [model.hidden_states(s[None])[0] for s in seqs]
    T, pad_id = 16, 0
    for side in ("left", "right", "mixed"):
        tokens = torch.full((3, T), pad_id)
        mask = torch.zeros(3, T, dtype=torch.long)
        spans = []
        for i, s in enumerate(seqs):
            left = side == "left" or (side == "mixed" and i % 2 == 0)
            a = T - len(s) if left else 0
            tokens[i, a : a + len(s)], mask[i, a : a + len(s)] = s, 1
            spans.append((a, a + len(s)))
        h = model.hidden_states(tokens, mask)
        assert torch.isfinite(h).all()
        for i, (a, b) in enumerate(spans):
            assert (h[i, a:b] - alone[i]).abs().max().item() < 1e-5, (side, i)
    # a mask of all ones is the same as no mask
    x = torch.randint(0, 97, (2, 10))
    assert (model(x, torch.ones_like(x)) - model(x)).abs().max().item() < 1e-5


def test_kv_cache_generation_equals_no_cache():
    model = tiny()
    torch.manual_seed(3)
    prompts = [torch.randint(3, 97, (n,)) for n in (5, 9)]
    tokens = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros(2, 9, dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding, as generation needs
        tokens[i, 9 - len(p) :], mask[i, 9 - len(p) :] = p, 1
    with_cache = model.generate(tokens, 20, attention_mask=mask)
    without = model.generate(tokens, 20, attention_mask=mask, use_cache=False)
    assert torch.equal(with_cache, without)
    for i, p in enumerate(prompts):  # and each row equals that prompt generated alone
        assert torch.equal(model.generate(p[None], 20)[0, len(p) :], with_cache[i, 9:])
    torch.manual_seed(4)
    a = model.generate(tokens, 10, temperature=0.9, top_k=5, attention_mask=mask)
    torch.manual_seed(4)
    b = model.generate(tokens, 10, temperature=0.9, top_k=5, attention_mask=mask, use_cache=False)
    assert torch.equal(a, b)


def test_gradient_checkpointing_same_gradients():
    model = tiny().train()
    x = torch.randint(0, 97, (2, 12))
    model(x).square().mean().backward()
    g = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.gradient_checkpointing = True
    model(x).square().mean().backward()
    for a, p in zip(g, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, atol=1e-6)


# ---------------------------------------------------------------- bad input
def test_bad_tokens_and_lengths():
    model = tiny()
    with pytest.raises(ValueError, match=r"token id 97 is outside the vocabulary \[0, 97\)"):
        model(torch.tensor([[1, 97]]))
    with pytest.raises(ValueError, match="token id -1"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match="sequence length 129 exceeds max_seq_len 128"):
        model(torch.zeros(1, 129, dtype=torch.long))
    with pytest.raises(
        ValueError, match="prompt 100 \\+ max_new_tokens 29 exceeds max_seq_len 128"
    ):
        model.generate(torch.zeros(1, 100, dtype=torch.long), 29)
    with pytest.raises(ValueError, match="left-padded"):
        model.generate(
            torch.zeros(1, 4, dtype=torch.long), 2, attention_mask=torch.tensor([[1, 1, 1, 0]])
        )


def test_truncated_and_corrupt_checkpoints(tmp_path):
    path = tmp_path / "m.bin"
    header = struct.pack("7i", 64, 172, 5, 8, 4, 512, 512)
    path.write_bytes(header + b"\0" * 4000)
    with pytest.raises(
        ValueError, match=r"m\.bin: 4028 bytes, but its header .* implies 1056540 bytes"
    ):
        load_transformer(path)
    path.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="too short"):
        load_transformer(path)
    with pytest.raises(ValueError, match="config.json"):
        load_transformer(tmp_path)
    # an HF directory whose weights miss a layer, and one whose weights are garbage
    pytest.importorskip("safetensors")
    make_hf(tmp_path / "hf", "mha-untied")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"the config claims 4 layers, the file holds 3"):
        load_transformer(tmp_path / "hf")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00garbage")
    with pytest.raises(ValueError, match=r"model\.safetensors: unreadable safetensors"):
        load_transformer(tmp_path / "hf")
    pt = tmp_path / "bad.pt"
    torch.save({"model": {}}, pt)
    with pytest.raises(ValueError, match="needs kind/config/model .* or model and model_args"):
        load_transformer(pt)
