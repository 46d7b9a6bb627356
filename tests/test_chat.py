"""data/chat.py: dialogues in the checkpoint's chat layout, the reward read at the end-of-turn
token, and the field's known failures pinned: pad == eos, an end token inside the prompt
(huggingface/transformers#35352), a response without its end token (allenai/reward-bench#90), a
duplicate BOS (OpenRLHF#393)."""

import json

import pytest
import torch
from conftest import pad, shared_path, smollm2_hf_tokenizers, tiny_model

from data.chat import ChatFormat, chat_format, hh_text, hh_turns
from data.pairs import encode_pair
from data.rows import read_pairs
from reward import RewardModel, last_real_index

HH = (
    "\n\nHuman: Hi there\n\nAssistant: Hello! How can I help?\n\nHuman: Name a color.\n\nAssistant:"
)


@pytest.fixture(scope="module")
def smollm2():
    from data.tokenizer import load_tokenizer

    return load_tokenizer(shared_path("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))


def test_hh_turns():
    assert hh_turns(HH) == [
        ("user", "Hi there"),
        ("assistant", "Hello! How can I help?"),
        ("user", "Name a color."),
    ]
    assert hh_turns("What is 2+2?") == [("user", "What is 2+2?")]  # a plain question


@pytest.mark.slow
def test_chatml_ids_equal_hf_apply_chat_template(smollm2, tmp_path_factory):
    """The ids of a rendered pair are those of HF's own template on the same dialogue."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(smollm2_hf_tokenizers(tmp_path_factory) / "hf")
    fmt = chat_format(smollm2)
    assert fmt.name == "chatml" and fmt.system.startswith("You are a helpful AI assistant")
    p, c, r, cut = encode_pair(
        smollm2, {"prompt": HH, "chosen": " Blue.", "rejected": " No."}, 512, fmt
    )
    messages = [{"role": role, "content": text} for role, text in hh_turns(HH)]
    for response, ids in (("Blue.", c), ("No.", r)):
        full = hf.apply_chat_template(
            messages + [{"role": "assistant", "content": response}], tokenize=True, return_dict=True
        )["input_ids"]
        # the template ends the turn with <|im_end|>\n; the reward is read at the <|im_end|>
        assert p + ids == full[:-1] and [full[-1]] == hf.encode("\n", add_special_tokens=False)
    assert not cut and c[-1] == r[-1] == smollm2.special_tokens["<|im_end|>"]
    assert (
        p.count(smollm2.bos_id) == len(hh_turns(HH)) + 2
    )  # one <|im_start|> per turn + system + reply


def test_the_end_token_survives_truncation_and_prompts_are_cut_from_the_left(smollm2):
    fmt = chat_format(smollm2)
    end = smollm2.special_tokens["<|im_end|>"]
    long = {"prompt": HH, "chosen": " word" * 400, "rejected": " no"}
    p, c, r, cut = encode_pair(smollm2, long, 64, fmt)
    assert cut and len(c) == 64 and c[-1] == end and r[-1] == end and p == []
    short = {"prompt": HH * 20, "chosen": " Blue.", "rejected": " No."}
    p, c, r, cut = encode_pair(smollm2, short, 64, fmt)
    full_p = fmt.prompt_ids(smollm2, short["prompt"])
    assert not cut and len(p) + len(c) <= 64 and p == full_p[len(full_p) - len(p) :]


def test_reward_at_the_last_end_token_with_pad_equal_to_eos(smollm2):
    """The prompt holds <|im_end|> (earlier turns) and padding is <|im_end|> too: the reward is
    still read at the response's own end token, the same with and without padding."""
    fmt = chat_format(smollm2)
    end = smollm2.special_tokens["<|im_end|>"]
    assert smollm2.pad_id == end  # SmolLM2 pads with its end-of-turn token
    p, c, r, _ = encode_pair(
        smollm2, {"prompt": HH, "chosen": " Blue.", "rejected": " Red!"}, 512, fmt
    )
    assert end in p  # an end token inside the prompt
    rows = [p + c, p + r + fmt.response_ids(smollm2, " and more")[:-1] + [end]]
    tokens, mask = pad(rows, pad_id=end)
    assert last_real_index(mask).tolist() == [len(rows[0]) - 1, len(rows[1]) - 1]
    rm = tiny_model(RewardModel, vocab_size=smollm2.vocab_size, max_seq_len=128)
    batch = rm(tokens, mask)
    alone = torch.stack([rm(torch.tensor([row])) for row in rows]).flatten()
    assert torch.allclose(batch, alone, atol=1e-5)
    left, left_mask = pad(rows, side="left", pad_id=end)
    assert torch.allclose(rm(left, left_mask), alone, atol=1e-5)


class Llama3Tok:
    """The special ids of Llama 3 and a character-level body: enough to check the layout."""

    special_tokens = {
        "<|begin_of_text|>": 1,
        "<|start_header_id|>": 3,
        "<|end_header_id|>": 4,
        "<|eot_id|>": 5,
    }
    chat_template = "{{ '<|start_header_id|>' + role + '<|end_header_id|>' }}"
    bos_id, eos_id, add_bos_token = 1, 2, True

    def encode(self, text, bos=False, eos=False):
        return [self.bos_id] * bos + [10 + ord(ch) % 50 for ch in text] + [self.eos_id] * eos


def test_llama3_layout_has_one_bos():
    tok = Llama3Tok()
    fmt = chat_format(tok)
    assert fmt.name == "llama3"
    p, c, _, _ = encode_pair(tok, {"prompt": HH, "chosen": " Blue.", "rejected": " No."}, 512, fmt)
    assert p.count(tok.bos_id) == 1 and p[0] == tok.bos_id  # never a second BOS
    assert p.count(3) == 4 and c[-1] == 5  # three turns + the reply's header; ends at <|eot_id|>
    with pytest.raises(ValueError, match="has no <|im_start|>"):
        chat_format(tok, "chatml")


def test_plain_layout_is_the_text_after_one_bos():
    tok = Llama3Tok()
    p, c, _, _ = encode_pair(tok, {"prompt": HH, "chosen": " Blue.", "rejected": " No."}, 512)
    assert p == tok.encode(HH, bos=True) and c == tok.encode("Blue.", eos=True)
    assert ChatFormat("plain").end_id(tok) == tok.eos_id


# a conversation as TRL's rows hold it: a system message and several turns
MESSAGES = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Name a color."},
]
TURNS = [(m["role"], m["content"]) for m in MESSAGES]


class ChatMLTok:
    """ChatML's two special ids and a character-level body; the template writes a default
    system message, as SmolLM2's does."""

    special_tokens = {"<|im_start|>": 1, "<|im_end|>": 2}
    chat_template = "<|im_start|>system\nYou are a bot.<|im_end|>\n{% for m in messages %}"
    bos_id, eos_id = 1, 2

    def encode(self, text, bos=False, eos=False):
        return [self.bos_id] * bos + [10 + ord(ch) % 50 for ch in text] + [self.eos_id] * eos


def test_chatml_system_and_several_turns_by_hand():
    tok = ChatMLTok()
    fmt = chat_format(tok)
    assert (fmt.name, fmt.system) == ("chatml", "You are a bot.")
    e = tok.encode
    nl = e("\n")
    system = [1, *e("system\nAnswer in one word."), 2, *nl]
    expected = system + [1, *e("user\nHi there"), 2, *nl]
    expected += [1, *e("assistant\nHello! How can I help?"), 2, *nl]
    expected += [1, *e("user\nName a color."), 2, *nl, 1, *e("assistant\n")]
    p, c, r, _ = encode_pair(tok, {"prompt": TURNS, "chosen": "Blue", "rejected": "No"}, 512, fmt)
    assert p == expected and c == [*e("Blue"), 2] and r == [*e("No"), 2]
    # without a system message of its own, the template's default one comes first
    p = fmt.prompt_ids(tok, TURNS[1:])
    assert p == [1, *e("system\nYou are a bot."), 2, *nl] + expected[len(system) :]


@pytest.mark.slow
def test_conversations_equal_hf_apply_chat_template(smollm2, tmp_path, tmp_path_factory):
    """A conversational row (system message, several turns), read and encoded as prepare does,
    gives the ids of HF's own template on the same messages."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(smollm2_hf_tokenizers(tmp_path_factory) / "hf")
    rows = tmp_path / "rows.jsonl"
    answers = {"chosen": "Blue.", "rejected": "I would rather not say."}
    row = {k: [*MESSAGES, {"role": "assistant", "content": v}] for k, v in answers.items()}
    rows.write_text(json.dumps(row) + "\n")
    (pair,), _ = read_pairs(rows)
    fmt = chat_format(smollm2)
    p, c, r, _ = encode_pair(smollm2, pair, 512, fmt)
    for response, ids in ((answers["chosen"], c), (answers["rejected"], r)):
        messages = [*MESSAGES, {"role": "assistant", "content": response}]
        full = hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        assert p + ids == full[:-1] and [full[-1]] == hf.encode("\n", add_special_tokens=False)
    assert c[-1] == smollm2.special_tokens["<|im_end|>"]
    assert "You are a helpful AI" not in smollm2.decode(p)  # the row's system message replaces it


def test_turns_in_plain_and_llama3_layouts():
    tok = Llama3Tok()
    text = "Answer in one word.\n\nHuman: Hi there\n\nAssistant: Hello! How can I help?"
    text += "\n\nHuman: Name a color.\n\nAssistant:"
    assert hh_text(TURNS) == text
    assert ChatFormat("plain").prompt_ids(tok, TURNS) == tok.encode(text, bos=True)
    p = chat_format(tok).prompt_ids(tok, TURNS)
    assert p.count(tok.bos_id) == 1 and p.count(3) == 5  # 4 turns (system too) + the reply's
    assert p[1:3] == [3, *tok.encode("system")[:1]]
