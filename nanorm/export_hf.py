"""
Export a nanoRM reward model as a Hugging Face LlamaForSequenceClassification directory, which
transformers, TRL, OpenRLHF and vLLM load as a reward model.

    python -m nanorm.score --ckpt out/ckpt.pt --export_hf out/hf      # what score.py's CLI calls
    python -c "from transformers import AutoModelForSequenceClassification as M; M.from_pretrained('out/hf')"

It writes config.json, model.safetensors (float32, HF's tensor names) and the tokenizer:
tokenizer.json + tokenizer_config.json (with the chat template) for byte-level BPE, or
tokenizer.model + tokenizer_config.json for SentencePiece; a llama2.c .bin vocabulary has no HF
form and is left out (the directory then loads without a tokenizer). The BPE files are
data/bpe.py's bpe_tokenizer_files, which checkpoints carry too (ckpt.py). HF's tensor names come
from checkpoints.HF_NAMES, the table the reader uses.

The export is a folder of its own: written into a new folder beside the target, which then
replaces the target whole (command.new_folder), so a failure (a full disk) leaves the previous
export as it was, and no file of an earlier export (another vocabulary's tokenizer.model)
survives beside the new ones. Its record, .nanorm, lists the files; a folder without one that
lists all it holds (a model of the user's own, or an export by an older nanoRM) is refused.

Three details decide whether HF computes our rewards:
1. RoPE layout. HF rotates the halves of each head (pairs i and i + d/2), Meta and nanoRM rotate
   adjacent pairs (2i, 2i+1); the rows of wq and wk are permuted to HF's order, the inverse of
   checkpoints._unpermute.
2. The head. `score` is Linear(dim, 1) without a bias: our head's weight. A head whose bias is
   not 0 (trained with --center_coef > 0) cannot be written; we refuse, naming the bias.
3. The pad token. LlamaForSequenceClassification ignores the attention mask when it picks the
   token to score: it takes the rightmost token that is not config.pad_token_id. nanoRM reads the
   reward at the token that ends the response (EOS, <|im_end|>), and most LLaMA vocabularies pad
   with that very token (pad == eos): HF would then skip the end token and score the one before
   it, in every padded row and in every unpadded one too. So the export's pad_token_id (in
   config.json and the tokenizer) is never the end token: the dataset's pad id if it differs,
   else <unk> (SentencePiece, llama2.c) or the first special token that is not the end, BOS or
   EOS (<|endoftext|> in SmolLM2). Which id pads never matters to nanoRM, which pools by mask.

Length calibration and normalization (calibrate.py) are recorded, not applied: the HF model's
outputs are the RAW rewards. A LlamaForSequenceClassification cannot subtract a + b*log(L) by
itself, since it does not know where the prompt ends and the response begins. config.json's
"nanorm_reward" key holds {"length_calibration", "reward_normalization", "applied": false} as the
checkpoint stores them; a consumer serves r - (a + b*log L), L the response's tokens with its
end token, then (r - mean) / std (calibrate.served does both; eval_rm.py applies them to an
exported directory). Without either, the key is absent.

Simplified: only the scoring model is written (an LM-regularized model's LM head is dropped, as
LlamaForSequenceClassification has none), always in float32, in one unsharded file. HF computes
positions 0, 1, ... from the left, so left-padded batches need position_ids from the caller.
"""

import copy
import json
import os
import struct

import torch

from data.bpe import BPETokenizer, bpe_tokenizer_files
from data.chat import chat_format as find_format
from data.tokenizer import SentencePieceTokenizer
from nanorm.base.checkpoints import HF_NAMES
from nanorm.base.command import (
    DISK_FULL,
    MARKER,
    UsageError,
    atomic_write,
    disk_error,
    new_folder,
    read_record,
    write_record,
)
from reward import RewardModel


def permute_to_hf(w, n_heads, head_dim):
    """(n_heads * head_dim, dim) rows per head from interleaved order (x0, x1, x2, x3, ...) to
    HF's halves (x0, x2, ..., x1, x3, ...): the inverse of checkpoints._unpermute."""
    return w.view(n_heads, head_dim // 2, 2, -1).transpose(1, 2).reshape(n_heads * head_dim, -1)


def hf_state_dict(model):
    """HF names -> float32 tensors of a ScalarHeadModel: the backbone and `score.weight`."""
    # e.g. --subset_experts' gated mixture; a Critic has no score(): its head is its one head
    if getattr(type(model), "score", RewardModel.score) is not RewardModel.score:
        raise ValueError(
            f"a {type(model).__name__}'s reward is not its one head (its score(h) mixes others); "
            "HF's LlamaForSequenceClassification has one linear score: score it with nanoRM instead"
        )
    bias = model.head.bias
    if bias is not None and bias.item() != 0.0:
        raise ValueError(
            f"the head's bias is {bias.item():.6g}; HF's score Linear has no bias, so the "
            "exported rewards would all be shifted by it (train with --center_coef 0, where "
            "the bias stays 0)"
        )
    cfg = model.backbone.config
    out = {}
    for name, t in model.backbone.state_dict().items():
        if name == "output.weight" or name == "inv_freq":  # no LM head; RoPE is derived
            continue
        if name == "tok_embeddings.weight":
            out["model.embed_tokens.weight"] = t
        elif name == "norm.weight":
            out["model.norm.weight"] = t
        else:  # layers.3.attention.wq.weight -> model.layers.3.self_attn.q_proj.weight
            _, i, rest = name.split(".", 2)
            module, suffix = rest.rsplit(".", 1)
            if module == "attention.wq":
                t = permute_to_hf(t, cfg.n_heads, cfg.head_dim)
            elif module == "attention.wk":
                t = permute_to_hf(t, cfg.n_kv_heads, cfg.head_dim)
            out[f"model.layers.{i}.{HF_NAMES[module]}.{suffix}"] = t
    out["score.weight"] = model.head.weight
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in out.items()}


def hf_config(cfg, pad_id, bos_id, eos_id):
    """config.json of a LlamaForSequenceClassification with one label (the reward)."""
    return {
        "architectures": ["LlamaForSequenceClassification"],
        "model_type": "llama",
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "vocab_size": cfg.vocab_size,
        "num_labels": 1,
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
        "pad_token_id": pad_id,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def write_safetensors(path, tensors):
    """The safetensors format, written directly: an 8-byte little-endian header length, a JSON
    header {name: {dtype, shape, data_offsets}} (offsets into the data after the header), then
    the raw little-endian bytes of each tensor in order. float32 only."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        assert t.dtype == torch.float32 and t.is_contiguous(), name
        n = t.numel() * 4
        header[name] = {
            "dtype": "F32",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # pad with spaces so the data starts 8-byte aligned
    with atomic_write(path) as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors.values():
            f.write(t.numpy().astype("<f4", copy=False).tobytes())


def export_pad_id(tok, end_id, pad_id):
    """A pad id HF will not mistake for the reward token end_id (see the module docstring)."""
    if pad_id is not None and pad_id != end_id:
        return pad_id
    if isinstance(tok, BPETokenizer):
        taken = {end_id, tok.bos_id, tok.eos_id}
        free = sorted(i for i in tok.special_tokens.values() if i not in taken)
        if not free:
            raise ValueError("the tokenizer has no special token to pad with besides the end token")
        return free[0]
    return 0  # <unk> in SentencePiece and llama2.c vocabularies


def chat_template(fmt):
    """A Jinja chat template that renders a dialogue as data/chat.py's ChatFormat `fmt` does,
    the layout the model was trained on, or None for plain text. Unlike SmolLM2's own template
    it writes no newline after the last message: the rendered dialogue then ends with the
    end-of-turn token the reward is read at, not with a "\\n" the model never scored."""
    esc = {"\\": "\\\\", "'": "\\'", "\n": "\\n"}  # a Jinja string literal of text
    q = lambda text: "'" + "".join(esc.get(c, c) for c in text) + "'"
    if fmt.name == "chatml":
        system = ""
        if fmt.system is not None:  # the default system message, as data/chat.py adds it
            system = "<|im_start|>system\n" + fmt.system + "<|im_end|>\n"
            system = f"{{% if messages[0]['role'] != 'system' %}}{{{{ {q(system)} }}}}{{% endif %}}"
        return system + (
            "{% for m in messages %}"
            "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' }}"
            "{% if not loop.last or add_generation_prompt %}{{ '\\n' }}{% endif %}"
            "{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
        )
    if fmt.name == "llama3":
        return (
            "{{ '<|begin_of_text|>' }}{% for m in messages %}"
            "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] "
            "+ '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
        )
    return None


def sentencepiece_config(tok, pad_id, chat_format):
    """tokenizer_config.json of a SentencePiece vocabulary (tokenizer.model beside it)."""
    sp = tok.sp
    return {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": sp.id_to_piece(tok.bos_id),
        "eos_token": sp.id_to_piece(tok.eos_id),
        "unk_token": sp.id_to_piece(sp.unk_id()),
        "pad_token": sp.id_to_piece(pad_id),
        # the plain layout reads the reward at the EOS that ends the response: have the HF
        # tokenizer append it, so tokenizer(text) scores as nanoRM does
        "add_bos_token": True,
        "add_eos_token": chat_format == "plain",
        "legacy": False,
        "padding_side": "right",  # HF numbers positions from the left: see the docstring
        "clean_up_tokenization_spaces": False,
    }


def write_tokenizer(tok, out_dir, pad_id, chat_format):
    """The tokenizer files AutoTokenizer reads, padding with pad_id. Returns the names written."""
    if isinstance(tok, BPETokenizer):
        tok = copy.copy(tok)  # the same vocabulary, with the template of the trained layout
        tok.chat_template = chat_template(find_format(tok, chat_format))
        files = bpe_tokenizer_files(tok, pad_id)
    elif isinstance(tok, SentencePieceTokenizer):
        files = {
            "tokenizer.model": tok.sp.serialized_model_proto(),
            "tokenizer_config.json": json.dumps(
                sentencepiece_config(tok, pad_id, chat_format), indent=1
            ).encode(),
        }
    else:
        print(f"note: a {type(tok).__name__} has no Hugging Face form; no tokenizer written")
        return []
    for name, data in files.items():
        with atomic_write(os.path.join(out_dir, name)) as f:
            f.write(data)
    return list(files)


EXPORT = "nanorm.score --export_hf"  # the command that writes an export, in its record


def check_export_dir(out_dir):
    """Refuse, in one line, an out_dir that is a file or a link, or a folder holding anything
    its record (.nanorm) does not list as an export's file: a model of the user's own, however
    like ours, or an export by an older nanoRM (which kept no record). The export replaces the
    folder whole, so nothing in it may be the user's."""
    if os.path.islink(out_dir):
        raise UsageError(f"--export_hf {out_dir} is a link: give the folder itself")
    if not os.path.exists(out_dir):
        return
    if not os.path.isdir(out_dir):
        raise UsageError(f"--export_hf {out_dir} is a file: give a folder")
    files = read_record(out_dir, "--export_hf") or {}
    for name in sorted(set(os.listdir(out_dir)) - {MARKER}):
        if files.get(name) != EXPORT:
            why = "its record, .nanorm, does not list it" if files else "no .nanorm record"
            raise UsageError(
                f"--export_hf {out_dir} holds {name}, which no nanoRM export wrote ({why}): give "
                "a new folder (an older nanoRM's export: remove it first)"
            )


def export_hf(model, out_dir, tok=None, meta=None, record=None):
    """Write `model` (a ScalarHeadModel: its `head` is the score) to out_dir as a Hugging Face
    LlamaForSequenceClassification. tok: its tokenizer (or None); meta: the dataset's meta.json
    (end_id, pad_id, chat_format), as train_rm checkpoints hold it under "data_meta"; record:
    the checkpoint's dict, whose length calibration and normalization go to config.json."""
    meta = meta or {}
    out_dir = os.path.normpath(out_dir)  # "out/hf/": the folder itself, not a name inside it
    check_export_dir(out_dir)
    tensors = hf_state_dict(model)  # refuses a head bias before anything is written
    end_id = meta.get("end_id", tok.eos_id if tok is not None else None)
    pad_id = meta.get("pad_id", getattr(tok, "pad_id", None))
    pad_id = export_pad_id(tok, end_id, pad_id) if tok is not None else pad_id
    bos_id = meta.get("bos_id", getattr(tok, "bos_id", None))
    eos_id = meta.get("eos_id", getattr(tok, "eos_id", None))
    config = hf_config(model.backbone.config, pad_id, bos_id, eos_id)
    post = {k: (record or {}).get(k) for k in ("length_calibration", "reward_normalization")}
    if any(v is not None for v in post.values()):  # recorded for the consumer, not applied
        config["nanorm_reward"] = post | {"applied": False}
    had = os.path.exists(out_dir)
    try:
        with new_folder(out_dir) as tmp:  # replaces out_dir whole, only once all is written
            with atomic_write(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(config, f, indent=1)
            write_safetensors(os.path.join(tmp, "model.safetensors"), tensors)
            written = ["config.json", "model.safetensors"]
            if tok is not None:
                written += write_tokenizer(tok, tmp, pad_id, meta.get("chat_format", "auto"))
            write_record(tmp, dict.fromkeys(written, EXPORT))
    except OSError as e:
        disk = disk_error(e)
        if disk is None:
            raise
        kept = "the previous export is kept as it was" if had else "nothing was written"
        fix = (
            "free space, or give another folder"
            if disk.errno in DISK_FULL
            else "give a writable one"
        )
        raise UsageError(
            f"--export_hf {out_dir}: could not be written ({disk.strerror}); {kept}: {fix}"
        ) from None
    print(f"wrote {out_dir}/{{{', '.join(written)}}}: pad_token_id {pad_id}, reward at {end_id}")
    return config
