"""
Chat formatting: a dialogue rendered the way the checkpoint was trained to read it, and the token
the reward is read at.

    from data.chat import chat_format
    fmt = chat_format(tok)                       # from tok.chat_template: chatml, llama3 or plain
    prompt_ids = fmt.prompt_ids(tok, "\\n\\nHuman: Hi\\n\\nAssistant:")  # HH's own layout
    prompt_ids = fmt.prompt_ids(tok, [("system", "Be brief."), ("user", "Hi")])  # or turns
    response_ids = fmt.response_ids(tok, " Hello!")   # ... + the end-of-turn token

An instruct model has seen its dialogues in one layout only (ChatML's `<|im_start|>user\\n...
<|im_end|>` for SmolLM2, Llama 3's `<|start_header_id|>...<|eot_id|>`), so a reward model built
on it learns fastest from pairs in that layout. The reward is read at the token that ends the
assistant's turn (`<|im_end|>`, `<|eot_id|>`; EOS for plain text): it exists in every response,
the model has learned that it closes an answer, and a response cut short has none (the failure of
allenai/reward-bench#90, where a missing end token changed the scores).

The layout is chosen from the template's tokens, not by running its Jinja code (that would need
jinja2 and would execute a file's code): a template that writes `<|im_start|>` is ChatML, one that
writes `<|start_header_id|>` is Llama 3's, anything else is plain text. A default system message
written literally in a ChatML template (SmolLM2 has one) is kept, as the template would add it.

Special tokens are inserted by id, never by encoding their text, and the BOS only where the
layout has one: ChatML has none (SmolLM2's add_bos_token is false), Llama 3 starts with
`<|begin_of_text|>` once; encoding the rendered text with a tokenizer that adds its own BOS
gives the duplicate BOS of OpenRLHF#393. The text between special tokens is encoded piece by
piece, which gives the ids Hugging Face's apply_chat_template gives, since its tokenizer also
splits the text at special tokens before BPE.
"""

import re
from dataclasses import dataclass

_TURN = re.compile(r"\n\n(Human|Assistant):")
ROLES = {"Human": "user", "Assistant": "assistant"}


def hh_turns(prompt):
    """HH-RLHF's "\\n\\nHuman: ...\\n\\nAssistant: ..." prompt -> [(role, text), ...]. The
    final empty "Assistant:" (where the response goes) is dropped; text before the first marker,
    or a prompt with no markers at all (a plain question), is one user turn."""
    parts = _TURN.split(prompt)  # [before, role, text, role, text, ...]
    turns = [("user", parts[0].strip())] if parts[0].strip() else []
    for role, text in zip(parts[1::2], parts[2::2], strict=True):
        turns.append((ROLES[role], text.strip()))
    if turns and turns[-1] == ("assistant", ""):
        turns.pop()
    return turns


def hh_text(turns):
    """Turns -> HH's plain text, for a base model: a system message first as it is, then
    "\\n\\nHuman: ...\\n\\nAssistant: ...", ending with "\\n\\nAssistant:" (the reply's place)."""
    label = {"user": "\n\nHuman: ", "assistant": "\n\nAssistant: ", "system": ""}
    return "".join(label[role] + text for role, text in turns) + "\n\nAssistant:"


@dataclass
class ChatFormat:
    """How turns become ids. name: "chatml", "llama3" or "plain"."""

    name: str
    system: str | None = None  # a default system message the template adds (ChatML)

    def prompt_ids(self, tok, prompt):
        """Ids of the dialogue so far, ending where the assistant's response begins. prompt:
        HH text or a plain question (one user turn), or [(role, text), ...] turns (system, user,
        assistant: a conversational row's prompt, data/pairs.split_conversation)."""
        if self.name == "plain":  # the text itself after one BOS, as a base model reads it
            prompt = prompt if isinstance(prompt, str) else hh_text(prompt)
            return tok.encode(prompt, bos=True) if prompt else [tok.bos_id]
        turns = prompt if not isinstance(prompt, str) else hh_turns(prompt)
        special = tok.special_tokens
        if self.name == "chatml":
            start, end = special["<|im_start|>"], special["<|im_end|>"]
            if self.system is not None and (not turns or turns[0][0] != "system"):
                turns = [("system", self.system), *turns]
            ids = []
            for role, text in turns:  # <|im_start|>role\ntext<|im_end|>\n
                ids += [start, *tok.encode(f"{role}\n{text}"), end, *tok.encode("\n")]
            return ids + [start, *tok.encode("assistant\n")]
        # llama3: <|begin_of_text|> then <|start_header_id|>role<|end_header_id|>\n\ntext<|eot_id|>
        head, tail = special["<|start_header_id|>"], special["<|end_header_id|>"]
        ids = [special["<|begin_of_text|>"]]
        for role, text in turns:
            ids += [head, *tok.encode(role), tail, *tok.encode(f"\n\n{text}"), self.end_id(tok)]
        return ids + [head, *tok.encode("assistant"), tail, *tok.encode("\n\n")]

    def response_ids(self, tok, text):
        """Ids of a response, ending with the end-of-turn token the reward is read at."""
        if self.name == "plain":
            # a tokenizer with a dummy prefix would turn the leading space into a lone "▁";
            # dropping it reproduces the tokens the joined text gets
            return tok.encode(text.removeprefix(" "), eos=True)
        return [*tok.encode(text.strip()), self.end_id(tok)]

    def end_id(self, tok):
        """The token that ends a response: where the reward is read."""
        if self.name == "chatml":
            return tok.special_tokens["<|im_end|>"]
        if self.name == "llama3":
            return tok.special_tokens["<|eot_id|>"]
        return tok.eos_id


def chat_format(tok, name="auto"):
    """The ChatFormat for a tokenizer: `name` forces one; "auto" reads tok.chat_template."""
    template = getattr(tok, "chat_template", None) or ""
    special = getattr(tok, "special_tokens", None) or {}
    if name == "auto":
        if "<|im_start|>" in template:
            name = "chatml"
        elif "<|start_header_id|>" in template:
            name = "llama3"
        else:
            name = "plain"
    needs = {
        "chatml": ("<|im_start|>", "<|im_end|>"),
        "llama3": ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "plain": (),
    }
    if name not in needs:
        raise ValueError(f"chat format {name!r}: choose auto, {', '.join(needs)}")
    missing = [t for t in needs[name] if t not in special]
    if missing:
        raise ValueError(f"chat format {name}: the tokenizer has no {', '.join(missing)}")
    system = None
    if name == "chatml":  # a literal default system message, as SmolLM2's template writes it
        m = re.search(r"<\|im_start\|>system(?:\n|\\n)(.*?)<\|im_end\|>", template)
        system = m.group(1) if m and "{" not in m.group(1) else None
    return ChatFormat(name, system)
