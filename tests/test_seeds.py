"""ColossalChat's and LLMBook's classes under their own names and calls: ColossalChat's RewardModel, Critic and
RLVRRewardModel and LLMBook's LlamaRewardModel, built and called as their usage examples do (a
local path for the hub name, the CPU for .cuda()); the README's snippets for them; and a
checkpoint without a vocabulary refused under data of another vocabulary size."""

import re

import pytest
import torch
from conftest import ROOT, shared_path, tiny_model
from launcher import python

from critic import Critic
from nanorm.base.checkpoints import load_transformer
from nanorm.base.command import UsageError
from nanorm.ckpt import check_tokenizer, save_checkpoint
from reward import LMRegularizedRewardModel, RewardModel
from verifiable import RLVRRewardModel, gsm8k_reward, math_reward

HEADING = "## Coming from ColossalChat, LLMBook or TRL"


def stories():
    return str(shared_path("llama2c", "stories260K", "stories260K.bin"))


def tok512():
    from data.tokenizer import load_tokenizer

    return load_tokenizer(shared_path("llama2c", "stories260K", "tok512.bin"))


@pytest.fixture
def at_root(monkeypatch):
    """The README's snippets name ../shared/data from the project root."""
    stories()
    monkeypatch.chdir(ROOT)


# ----------------------------------------------------------------------------- README snippets
# the same code as the README's section, run as written (printing what the README shows)


def test_readme_snippet_reward_model(at_root, capsys):
    torch.manual_seed(0)
    model = RewardModel(pretrained="../shared/data/llama2c/stories260K/stories260K.bin")
    input_ids = torch.tensor([[1, 403, 11, 2, 0], [1, 87, 300, 52, 2]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    reward = model(input_ids=input_ids, attention_mask=attention_mask)
    print(reward.shape, model.get_input_embeddings())
    assert reward.shape == (2,) and "Embedding(512, 64)" in capsys.readouterr().out


def test_readme_snippet_critic(at_root):
    torch.manual_seed(0)
    critic = Critic(pretrained="../shared/data/llama2c/stories260K/stories260K.bin")
    input_ids = torch.tensor([[1, 403, 11, 2, 0], [1, 87, 300, 52, 2]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    values = critic(input_ids=input_ids, attention_mask=attention_mask)
    print(values.shape, values[0, -1].item())  # (B, T); 0 at padding
    assert values.shape == (2, 5) and values[0, -1].item() == 0.0


def test_readme_snippet_rlvr_reward_model(at_root):
    from data.tokenizer import load_tokenizer

    tok = load_tokenizer("../shared/data/llama2c/stories260K/tok512.bin")

    def ends_with_answer(input_ids, attention_mask, **kwargs):  # ColossalChat's shape
        s, e = kwargs["response_start"], kwargs["response_end"]  # e inclusive, as theirs decode
        text = kwargs["tokenizer"].decode(input_ids[s : e + 1].tolist())
        return torch.tensor(1.0 if text.endswith(kwargs["gt_answer"]) else 0.0)

    prompt, response = tok.encode("Q: 9*2?", bos=True), tok.encode(" #### 18")
    input_ids = torch.tensor([prompt + response])
    rm = RLVRRewardModel([ends_with_answer, gsm8k_reward], tokenizer=tok)
    end = len(prompt) + len(response) - 1  # the index of the response's last token
    r = rm(input_ids, torch.ones_like(input_ids), response_start=[len(prompt)],
           response_end=[end], gt_answer=["18"])  # fmt: skip
    print(r)  # 1 + 1
    assert r.tolist() == [2.0]


def test_readme_snippet_llmbook_call(at_root):
    torch.manual_seed(0)
    model = LMRegularizedRewardModel(
        pretrained="../shared/data/llama2c/stories260K/stories260K.bin"
    )
    chosen = torch.tensor([[1, 403, 11, 87, 300, 2]])
    rejected = torch.tensor([[1, 403, 11, 52, 2, 0]])
    response_ids = chosen.masked_fill(torch.arange(6) < 3, -100)  # the response's tokens only
    loss = model(sent1_idx=chosen, attention_mask_1=torch.ones_like(chosen),
                 sent2_idx=rejected, attention_mask_2=(rejected != 0).long(),
                 labels=torch.zeros(1), prompt_ids=chosen, lm_attn_mask=torch.ones_like(chosen),
                 response_ids=response_ids)  # fmt: skip
    print(loss)  # rm_loss + lm_loss
    assert loss.dim() == 0 and torch.isfinite(loss)


@pytest.mark.slow
def test_readme_section_runs():
    """Every ```python block under the README's heading, run as written from the root."""
    readme = (ROOT / "README.md").read_text()
    if HEADING not in readme:
        pytest.skip(f"README.md has no {HEADING!r} section yet")
    stories()
    section = readme.split(HEADING, 1)[1]
    section = re.split(r"\n## ", section, maxsplit=1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    names = ("RewardModel(", "Critic(", "RLVRRewardModel(", "LMRegularizedRewardModel(")
    for name in (*names, "RewardModelTrainer("):
        assert any(name in code for code in blocks), f"no snippet builds a {name[:-1]}"
    for code in blocks:
        p = python(["-c", code], timeout=300)
        assert p.returncode == 0, (code[:200], p.stderr[-1500:])


# ----------------------------------------------------------------------------- ColossalChat


def test_colossalchat_reward_model_usage(at_root):
    """ColossalChat: model = RewardModel(pretrained=...); reward = model(input_ids=...,
    attention_mask=...), one reward per sequence at its last real token."""
    torch.manual_seed(0)
    model = RewardModel(pretrained=stories())
    ids = torch.tensor([[1, 403, 11, 87, 2, 0, 0], [0, 0, 1, 403, 11, 87, 2]])
    mask = (torch.arange(7) < 5).long().expand(2, -1).clone()
    mask[1] = mask[0].flip(0)  # the same text, right- and left-padded
    reward = model(input_ids=ids, attention_mask=mask, use_cache=False)  # extra keyword ignored
    print("RewardModel:", reward)
    assert reward.shape == (2,)
    torch.testing.assert_close(reward[0], reward[1], atol=1e-5, rtol=1e-5)
    assert torch.equal(model(ids, mask), reward)  # positional too
    assert model.get_input_embeddings() is model.backbone.tok_embeddings
    assert model.get_output_embeddings() is model.backbone.output


def test_colossalchat_critic_usage(at_root):
    """ColossalChat: critic = Critic(pretrained=...); values = critic(input_ids=...,
    attention_mask=...), one value per token."""
    torch.manual_seed(0)
    critic = Critic(pretrained=stories())
    ids = torch.tensor([[1, 403, 11, 87, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    values = critic(input_ids=ids, attention_mask=mask, return_dict=True)
    print("Critic:", values)
    assert values.shape == (1, 6) and values[0, -1] == 0
    assert torch.equal(critic(ids, mask), values)
    assert critic.get_input_embeddings().weight.shape == (512, 64)


def colossal_gsm8k_reward_fn(input_ids, attention_mask, **kwargs):
    """The shape of ColossalChat's gsm8k_reward_fn: 1 for the format (the tags), 9 more for the
    answer; it decodes input_ids[s : e + 1], the end inclusive."""
    gt_answer, tokenizer = kwargs["gt_answer"], kwargs["tokenizer"]
    s, e = kwargs["response_start"], kwargs["response_end"]
    reward = torch.tensor(0.0).to(input_ids.device)
    if gt_answer is None:
        return reward
    text = tokenizer.decode(input_ids[s : e + 1].tolist())
    tags = kwargs["tags"]
    if any(text.count(t["text"]) != t["num_occur"] for t in tags.values()):
        return reward
    final = text.split(tags["answer_start"]["text"])[-1].split(tags["answer_end"]["text"])[0]
    reward += 1.0
    if final.strip().replace(" ", "").lower() == gt_answer.strip().replace(" ", "").lower():
        reward = reward + 9.0
    return reward


TAGS = {
    "think_start": {"text": "<think>", "num_occur": 1},
    "think_end": {"text": "</think>", "num_occur": 1},
    "answer_start": {"text": "<answer>", "num_occur": 1},
    "answer_end": {"text": "</answer>", "num_occur": 1},
}


def rlvr_batch(tok):
    """Two rows: left-padded prompt, response, right padding; -> ids, mask, starts, ends
    (exclusive), the answers."""
    prompts = ["Q: 9*2?", "Q: 3+4?"]
    responses = ["<think>9*2</think><answer>18</answer>", "<think>3+4</think><answer>7</answer>"]
    rows = [
        (tok.encode(p, bos=True), tok.encode(r)) for p, r in zip(prompts, responses, strict=True)
    ]
    width = max(len(p) + len(r) for p, r in rows) + 2
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    starts, ends = [], []
    for b, (p, r) in enumerate(rows):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r)
        mask[b, : len(p) + len(r)] = 1
        starts.append(len(p))
        ends.append(len(p) + len(r))
    return ids, mask, torch.tensor(starts), torch.tensor(ends), ["18", "7"]


def test_colossalchat_rlvr_usage_and_the_end_conventions():
    """ColossalChat: RLVRRewardModel(reward_fn_list=[gsm8k_reward_fn], tokenizer=tok, tags=tags)
    then reward_model(input_ids, attention_mask, response_start=, response_end=, gt_answer=).
    ColossalChat's functions and nanoRM's text functions in one list read the same span, the
    end inclusive: the last token ("7" in the second row's "...>7</answer>") is read. A caller
    holding exclusive ends passes end - 1; passing them unconverted drops the last token, for
    every function alike (nothing shifts the caller's values)."""
    tok = tok512()
    ids, mask, starts, ends, gts = rlvr_batch(tok)
    for fns in ([colossal_gsm8k_reward_fn], [colossal_gsm8k_reward_fn, math_reward]):
        rm = RLVRRewardModel(reward_fn_list=fns, tokenizer=tok, tags=TAGS)
        assert rm.to("cpu") is rm and rm.eval() is rm
        want = [10.0 + (len(fns) - 1)] * 2
        r = rm(ids, mask, response_start=starts, response_end=ends - 1, gt_answer=gts)
        print("RLVRRewardModel:", r)
        assert r.shape == (2,) and r.dtype == torch.float32 and r.tolist() == want
        # no end: nanoRM's functions read to the last real token; ColossalChat's need one
        if len(fns) == 2:
            only_ours = RLVRRewardModel([math_reward], tokenizer=tok)
            assert only_ours(ids, mask, response_start=starts, gt_answer=gts).tolist() == [1, 1]
    # exclusive ends passed as they are: one past the last token, which is padding here
    r = RLVRRewardModel([math_reward], tokenizer=tok)(
        ids, mask, response_start=starts, response_end=ends - 2, gt_answer=gts
    )
    assert r.tolist() == [0.0, 0.0]  # "</answer" cut: no box, no tagged answer read


def test_rlvr_passes_the_callers_values_and_keywords_unchanged():
    """Each function gets input_ids[i], attention_mask[i], response_start[i], response_end[i],
    gt_answer[i] as the caller passed them (tensors stay tensors: .item() works) and every
    constructor keyword, a name nanoRM might have wanted for itself (weights=) included."""
    tok = tok512()
    ids, mask, starts, ends, gts = rlvr_batch(tok)
    seen = []

    def colossal_style(input_ids, attention_mask, **kwargs):
        s, e = kwargs["response_start"].item(), kwargs["response_end"].item()  # as theirs do
        seen.append((s, e, kwargs["gt_answer"], kwargs["weights"], kwargs["tokenizer"]))
        assert torch.equal(input_ids, ids[len(seen) - 1]) and attention_mask.dtype == mask.dtype
        return torch.tensor(float(e - s))

    rm = RLVRRewardModel([colossal_style], tokenizer=tok, weights=[2.0])
    r = rm(ids, mask, response_start=starts, response_end=ends - 1, gt_answer=gts)
    assert [x[:4] for x in seen] == [
        (starts[i].item(), ends[i].item() - 1, gts[i], [2.0]) for i in range(2)
    ]
    assert all(x[4] is tok for x in seen)
    assert r.tolist() == (ends - 1 - starts).float().tolist()


def test_text_functions_need_the_tokenizer():
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="tokenizer="):
        RLVRRewardModel([gsm8k_reward])(ids, gt_answer=["1"])
    assert gsm8k_reward("#### 12", "12") == 1.0  # on text, as before


# ----------------------------------------------------------------------------- LLMBook


def book_batch():
    torch.manual_seed(1)
    chosen = torch.randint(3, 512, (2, 9))
    rejected = torch.randint(3, 512, (2, 7))
    chosen_mask = torch.ones_like(chosen)
    chosen_mask[1, -2:] = 0
    rejected_mask = torch.ones_like(rejected)
    rejected_mask[0, -1] = 0
    response = chosen.masked_fill(torch.arange(9) < 4, -100).masked_fill(chosen_mask == 0, -100)
    return chosen, chosen_mask, rejected, rejected_mask, response


def test_llmbook_forward_usage_is_the_corrected_loss(at_root):
    """LLMBook: loss = model(sent1_idx, attention_mask_1, sent2_idx, attention_mask_2, labels,
    prompt_ids, lm_attn_mask, response_ids), labels all 0 (sent1 the chosen): the loss is
    nanoRM's loss() of that pair with the LM term on the response (coefficient 1), which
    trains towards sent1."""
    torch.manual_seed(0)
    model = LMRegularizedRewardModel(pretrained=stories())
    chosen, c_mask, rejected, r_mask, response = book_batch()
    labels = torch.zeros(2)
    loss = model(chosen, c_mask, rejected, r_mask, labels, chosen, c_mask, response)
    print("LlamaRewardModel.forward:", loss)
    ref, _ = model.loss(chosen, c_mask, rejected, r_mask, (response != -100).long(), lm_coef=1.0)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6 * ref.abs().item())
    keywords = dict(sent1_idx=chosen, attention_mask_1=c_mask, sent2_idx=rejected)
    keywords |= dict(attention_mask_2=r_mask, labels=labels, prompt_ids=chosen)
    keywords |= dict(lm_attn_mask=c_mask, response_ids=response)
    assert torch.equal(model(**keywords), loss)
    # the LM rows given apart (one more column of padding: their own backbone call) agree
    wider = dict(prompt_ids=torch.cat([chosen, torch.zeros_like(chosen[:, :1])], 1))
    wider |= dict(lm_attn_mask=torch.cat([c_mask, torch.zeros_like(c_mask[:, :1])], 1))
    wider |= dict(response_ids=torch.cat([response, torch.full_like(response[:, :1], -100)], 1))
    apart, _ = model.llmbook_loss(**keywords | wider)
    torch.testing.assert_close(apart, loss, rtol=1e-5, atol=1e-5 * loss.abs().item())
    # labels 1 say sent2 was preferred: the pair swapped
    swapped, _ = model.llmbook_loss(**keywords | dict(labels=torch.ones(2)))
    _, stats = model.loss(chosen, c_mask, rejected, r_mask, (response != -100).long(), 1.0)
    d = stats["r_chosen"] - stats["r_rejected"]
    rm_swapped = torch.nn.functional.softplus(d).mean()
    torch.testing.assert_close(swapped - (ref - stats["rm_loss"]), rm_swapped)
    # and the gradient of the pairwise term raises r(sent1) when labels are the book's 0
    model.zero_grad()
    r = model(chosen, c_mask)
    (r[0]).backward()
    g = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    rm_only, _ = model.llmbook_loss(**keywords, lm_coef=0.0)
    rm_only.backward()
    step = sum((p.grad * g[n]).sum() for n, p in model.named_parameters() if n in g)
    assert step < 0  # descending the loss raises sent1's reward


def test_llmbook_usage_example_as_written():
    """LLMBook's example: LlamaRewardModel(config) then model(...) with
    labels=torch.zeros(batch_size, seq_len), one value per row: the same loss as labels (B,)."""
    from model import ModelConfig

    torch.manual_seed(0)
    config = ModelConfig(dim=64, n_layers=2, n_heads=4, vocab_size=512, max_seq_len=64)
    model = LMRegularizedRewardModel(config)
    batch_size, seq_len = 2, 9
    chosen, c_mask, rejected, r_mask, response = book_batch()
    args = (chosen, c_mask, rejected, r_mask)
    loss = model(*args, torch.zeros(batch_size, seq_len), chosen, c_mask, response)
    print("LlamaRewardModel(config):", loss)
    assert torch.equal(loss, model(*args, torch.zeros(batch_size), chosen, c_mask, response))
    with pytest.raises(ValueError, match="one value per row"):
        mixed = torch.zeros(batch_size, seq_len)
        mixed[0, 3] = 1
        model(*args, mixed, chosen, c_mask, response)


def test_config_builds_a_new_model_of_that_shape():
    """RewardModel(config=c) and Critic(config=c), as ColossalChat's constructors take config=; a
    transformers LlamaConfig is read as the same shape."""
    from model import ModelConfig

    c = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=61, max_seq_len=32)
    for cls in (RewardModel, Critic, LMRegularizedRewardModel):
        model = cls(config=c)
        assert model.backbone.config == c and model.head.in_features == 32
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=61, intermediate_size=96, max_position_embeddings=32,
    )  # fmt: skip
    model = LMRegularizedRewardModel(hf)
    got = model.backbone.config
    assert (got.dim, got.n_layers, got.n_heads, got.n_kv_heads, got.vocab_size) == (32, 2, 4, 2, 61)
    assert model.backbone.layers[0].feed_forward.w1.out_features == 96
    # both, as ColossalChat's BaseModel takes them: the file's weights read into config's shape
    own = load_transformer(stories()).config
    both = RewardModel(pretrained=stories(), config=own)
    assert both.backbone.config == own
    with pytest.raises(UsageError, match="token embeddings .512, 64., the config claims .61, 32."):
        RewardModel(config=c, pretrained=stories())


def test_a_rewards_call_is_unchanged_on_the_lm_model():
    model = tiny_model(LMRegularizedRewardModel)
    ids = torch.randint(0, 61, (2, 6))
    mask = torch.ones_like(ids)
    assert torch.equal(model(ids, mask), RewardModel.forward(model, ids, mask))
    assert torch.equal(model(input_ids=ids, attention_mask=mask, position_ids=None), model(ids))


# ----------------------------------------------------------------------------- pretrained=


def test_pretrained_reads_every_format(tmp_path):
    """RewardModel(pretrained=path) for ckpt.pt, llama2.c .bin and .pt, Meta and HF
    directories and .gguf: the backbone is the file's, bit for bit."""
    from test_init_formats import write

    paths = [(stories(), load_transformer(stories()))]
    for fmt in ("llama2c-pt", "meta", "hf"):
        try:
            paths.append(write(fmt, tmp_path / fmt, 61))
        except pytest.skip.Exception:
            pass
    try:
        from test_train import write_gguf

        base = paths[-1][1]
        paths.append((write_gguf(base, tmp_path / "m.gguf"), base))
    except pytest.skip.Exception:
        pass
    for path, base in paths:
        for cls in (RewardModel, Critic, LMRegularizedRewardModel):
            model = cls(pretrained=path)
            for k, v in base.state_dict().items():
                assert torch.equal(model.backbone.state_dict()[k], v), (path, cls, k)


def test_pretrained_ckpt_pt_gives_back_the_trained_heads(tmp_path):
    rm = tiny_model(RewardModel)
    save_checkpoint(tmp_path / "ckpt.pt", rm)
    ids = torch.randint(0, 61, (2, 6))
    assert torch.equal(RewardModel(pretrained=tmp_path / "ckpt.pt")(ids), rm(ids))
    critic = Critic(pretrained=tmp_path / "ckpt.pt")  # PPO's critic from the reward model
    assert torch.equal(critic(ids), Critic.from_reward_model(rm)(ids))


def test_pretrained_refuses_a_hub_name_in_one_line():
    with pytest.raises(UsageError) as e:
        RewardModel(pretrained="meta-llama/Llama-2-7b-hf")
    msg = str(e.value)
    assert "\n" not in msg and "huggingface-cli download meta-llama/Llama-2-7b-hf" in msg
    with pytest.raises(TypeError):
        RewardModel()


# ----------------------------------------------------------------------------- vocabularies


def test_a_checkpoint_without_vocabulary_checks_the_size(tmp_path, capsys):
    """stories260K.bin (512 embedding rows, no tokenizer) under the arithmetic data (320):
    refused in one line naming both sizes and the --tokenizer; equal sizes: one warning."""
    from data.arith.prepare import main as prepare_arith

    init = stories()
    meta = prepare_arith(["--out_dir", str(tmp_path), "--n_train", "16", "--n_val", "8"])
    assert meta["vocab_size"] == 320
    with pytest.raises(UsageError) as e:
        check_tokenizer(init, meta, str(tmp_path))
    msg = str(e.value)
    assert "\n" not in msg and "512" in msg and "320" in msg and "--tokenizer" in msg
    assert "tok512.bin" in msg  # llama2.c's tokenizer lies beside its model
    capsys.readouterr()
    check_tokenizer(init, dict(meta, vocab_size=512), str(tmp_path))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning:") and "512" in err
