"""score.py --export_hf: the exported LlamaForSequenceClassification gives nanoRM's rewards in
transformers (padded batches, its own tokenizer on raw text and on chat messages), and reads back
into nanoRM; checkpoints carry their tokenizer (checkpoint_tokenizer)."""

import json

import pytest
import torch
from conftest import pad, shared_path, tiny_model

from nanorm.base.checkpoints import _unpermute
from nanorm.ckpt import checkpoint_tokenizer, save_checkpoint, tokenizer_files
from nanorm.export_hf import permute_to_hf
from reward import RewardModel

GGUF = ("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
TEXTS = ["One two three.", "A cat sat on the mat, 42 times!", "Hello"]


def rel_close(a, b, rtol=1e-5):
    """|a - b| <= rtol * max|b|: relative to the scale of the rewards."""
    return (a - b).abs().max().item() <= rtol * b.abs().max().item()


@pytest.fixture(scope="module")
def sp_tok(tmp_path_factory):
    """A small SentencePiece vocabulary trained here (plain text layout, pad == eos)."""
    pytest.importorskip("sentencepiece")
    from data.tokenizer import SentencePieceTokenizer, train_sentencepiece

    words = "the cat sat on a mat one two three four hello world and then it ran away".split()
    texts = [" ".join(words[i:] + words[:i]) + f" {i} times!" for i in range(len(words))] * 4
    path = tmp_path_factory.mktemp("sp") / "tok.model"
    return SentencePieceTokenizer(train_sentencepiece(texts, path, vocab_size=300))


@pytest.fixture(scope="module")
def bpe_tok():
    from data.bpe import BPETokenizer

    return BPETokenizer.from_gguf(shared_path(*GGUF))


def export(model, tok, meta, out):
    from nanorm.export_hf import export_hf

    return export_hf(model, str(out), tok, meta)


def hf_model(out):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForSequenceClassification.from_pretrained(str(out)).eval()


def test_a_critic_exports_its_one_head():
    from critic import Critic
    from nanorm.export_hf import hf_state_dict

    critic = tiny_model(Critic)
    tensors = hf_state_dict(critic)
    assert torch.equal(tensors["score.weight"], critic.head.weight.float())
    assert torch.equal(tensors["model.norm.weight"], critic.backbone.norm.weight.float())


def test_permutation_is_the_inverse_of_the_readers():
    w = torch.randn(4 * 8, 16)
    assert torch.equal(_unpermute(permute_to_hf(w, 4, 8), 4, 8), w)
    assert not torch.equal(permute_to_hf(w, 4, 8), w)


def test_export_equals_transformers_on_a_padded_batch(sp_tok, tmp_path):
    tok = sp_tok
    model = tiny_model(RewardModel, vocab_size=tok.vocab_size)
    eos = tok.eos_id
    assert tok.pad_id == eos  # LLaMA's vocabularies: the field's pitfall
    meta = dict(end_id=eos, pad_id=eos, bos_id=tok.bos_id, eos_id=eos, chat_format="plain")
    config = export(model, tok, meta, tmp_path)
    assert config["pad_token_id"] not in (eos, None)  # never the token the reward is read at
    hf = hf_model(tmp_path)
    seqs = [tok.encode(t, bos=True, eos=True) for t in TEXTS]  # each ends with the EOS
    tokens, mask = pad(seqs, pad_id=config["pad_token_id"])
    ours = model(tokens, mask)
    with torch.no_grad():
        theirs = hf(input_ids=tokens, attention_mask=mask).logits[:, 0]
    assert rel_close(theirs, ours), (theirs, ours)

    # the pitfall the pad choice avoids: with pad == eos HF scores the token before each EOS
    tokens, mask = pad(seqs, pad_id=eos)
    hf.config.pad_token_id = eos
    with torch.no_grad():
        wrong = hf(input_ids=tokens, attention_mask=mask).logits[:, 0]
    assert ((wrong - ours).abs() > 1e-3).all(), (wrong, ours)


def test_export_tokenizer_reads_raw_text_as_nanorm(sp_tok, tmp_path):
    """AutoTokenizer on the raw text + the exported model = nanoRM's reward for that text
    (plain layout: BOS + text + EOS, the EOS appended by the exported tokenizer)."""
    transformers = pytest.importorskip("transformers")
    tok = sp_tok
    model = tiny_model(RewardModel, vocab_size=tok.vocab_size)
    meta = dict(end_id=tok.eos_id, pad_id=tok.eos_id, chat_format="plain")
    export(model, tok, meta, tmp_path)
    hf, hf_tok = hf_model(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    batch = hf_tok(TEXTS, padding=True, return_tensors="pt")
    for i, t in enumerate(TEXTS):
        n = int(batch["attention_mask"][i].sum())
        assert batch["input_ids"][i, :n].tolist() == tok.encode(t, bos=True, eos=True), t
    with torch.no_grad():
        theirs = hf(**batch).logits[:, 0]
    ours = torch.stack([model(torch.tensor([tok.encode(t, bos=True, eos=True)]))[0] for t in TEXTS])
    assert rel_close(theirs, ours), (theirs, ours)


def test_export_chatml_apply_chat_template(bpe_tok, tmp_path):
    """A byte-level BPE / ChatML model (SmolLM2's vocabulary): HF's apply_chat_template on the
    exported tokenizer gives data/chat.py's ids, ending with <|im_end|>, and the same reward."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    from data.chat import chat_format

    tok = bpe_tok
    model = tiny_model(RewardModel, vocab_size=tok.vocab_size)
    fmt = chat_format(tok)
    assert fmt.name == "chatml" and tok.pad_id == fmt.end_id(tok)  # SmolLM2 pads with <|im_end|>
    meta = dict(end_id=fmt.end_id(tok), pad_id=tok.pad_id, chat_format="chatml")
    config = export(model, tok, meta, tmp_path)
    assert config["pad_token_id"] == tok.special_tokens["<|endoftext|>"]

    # the tokenizer.json alone, read by HF tokenizers: the same ids as ours (digits split)
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in ["In 2024, 1234 cats; 日本 😀 e\u0301\n\n  x", "<|im_start|>user\nHi<|im_end|>"]:
        assert raw.encode(text, add_special_tokens=False).ids == tok.encode(text)

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf_tok.pad_token_id == config["pad_token_id"]
    dialogues = [
        ("What is 2 + 2?", "It is 4."),
        ("Name a colour.", "Blue, like the sky on a clear day in June."),
    ]
    ours, ids = [], []
    for q, a in dialogues:
        mine = fmt.prompt_ids(tok, f"\n\nHuman: {q}\n\nAssistant:") + fmt.response_ids(tok, a)
        msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        theirs = hf_tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]
        assert list(theirs) == mine
        ours.append(model(torch.tensor([mine]))[0])
        ids.append(mine)
    batch = hf_tok.pad({"input_ids": ids}, return_tensors="pt")  # right-padded with <|endoftext|>
    with torch.no_grad():
        theirs = hf_model(tmp_path)(**batch).logits[:, 0]
    assert rel_close(theirs, torch.stack(ours)), (theirs, ours)

    # and back: nanoRM reads the export (score -> head) to the same rewards and tokenizer
    from data.tokenizer import tokenizer_fingerprint

    back = RewardModel(pretrained=tmp_path)
    tokens, mask = pad(ids)
    assert rel_close(back(tokens, mask), model(tokens, mask), rtol=1e-6)
    assert tokenizer_fingerprint(checkpoint_tokenizer(tmp_path)) == tokenizer_fingerprint(tok)


def test_export_refuses_a_head_bias(tmp_path):
    model = tiny_model(RewardModel)
    with torch.no_grad():
        model.head.bias.fill_(0.25)
    with pytest.raises(ValueError, match="bias is 0.25"):
        export(model, None, {}, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


def test_cli_export_from_a_checkpoint_that_carries_its_tokenizer(sp_tok, tmp_path):
    """A train_rm-style checkpoint whose tokenizer file is gone: scoring and export still work,
    and a tokenizer that does not match the recorded fingerprint is refused."""
    import nanorm.score as score
    from data.tokenizer import tokenizer_fingerprint

    tok = sp_tok
    model = tiny_model(RewardModel, vocab_size=tok.vocab_size)
    meta = dict(
        tokenizer=str(tmp_path / "gone.model"),
        end_id=tok.eos_id,
        pad_id=tok.eos_id,
        tokenizer_fingerprint=tokenizer_fingerprint(tok),
        chat_format="plain",
    )
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model)  # kind, config and weights; then what train_rm adds beside them
    ckpt = dict(torch.load(path, weights_only=True), data_meta=meta)
    torch.save(dict(ckpt, tokenizer_files=tokenizer_files(tok)), path)
    ckpt = torch.load(path, weights_only=True)
    assert tokenizer_fingerprint(checkpoint_tokenizer(str(path))) == meta["tokenizer_fingerprint"]
    score.main(["--ckpt", str(path), "--export_hf", str(tmp_path / "hf")])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_labels"] == 1 and config["architectures"] == [
        "LlamaForSequenceClassification"
    ]
    assert "nanorm_reward" not in config  # nothing stored: nothing recorded (test_calibrate.py)

    torch.save(dict(ckpt, data_meta=dict(meta, tokenizer_fingerprint="0" * 16)), path)
    with pytest.raises(ValueError, match="fingerprint"):
        checkpoint_tokenizer(str(path))
    torch.save(dict(ckpt, tokenizer_files=None), path)
    with pytest.raises(ValueError, match="carries no tokenizer .*pass --tokenizer"):
        checkpoint_tokenizer(str(path))
