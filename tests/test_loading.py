"""nanorm/base/checkpoints.py against what other code writes: ColossalChat's reward model (HF's
LlamaModel under "model." plus a Linear `value_head`, as its booster saves it), transformers'
LlamaModel saved alone, the keywords ColossalChat passes on to from_pretrained, and a file with
a tensor nothing reads. The references are transformers' own forwards on the same weights."""

import json

import pytest
import torch
from conftest import shared_path, tiny_hf_config

from nanorm.base.checkpoints import load
from nanorm.base.command import UsageError
from nanorm.ckpt import load_reward_model
from reward import LMRegularizedRewardModel, RewardModel

transformers = pytest.importorskip("transformers", reason="the references are transformers'")


def hf_config(tied):
    return tiny_hf_config(tie_word_embeddings=tied)


class ColossalRM(torch.nn.Module):
    """The module layout of ColossalChat's coati RewardModel (its `model` an AutoModel, i.e. a
    LlamaModel; `value_head` a Linear(dim, 1)), for its state dict and its reward."""

    def __init__(self, cfg):
        super().__init__()
        self.model = transformers.LlamaModel(cfg)
        self.value_head = torch.nn.Linear(cfg.hidden_size, 1)
        torch.nn.init.normal_(self.value_head.weight)  # a unit head shows errors
        torch.nn.init.normal_(self.value_head.bias)

    @torch.no_grad()
    def forward(self, ids, mask):  # the last hidden state at each row's last real token
        h = self.model(ids, attention_mask=mask).last_hidden_state
        last = (mask * torch.arange(ids.size(1))).max(dim=1).values
        return self.value_head(h[torch.arange(len(ids)), last]).squeeze(-1)


def right_padded(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = (17, 6, 30)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, 101, (n,), generator=g)
        mask[i, :n] = 1
    return ids, mask


def booster_dir(rm, d):
    """What ColossalChat's booster.save_model(model, d, shard=True) writes for its RewardModel
    (no transformers model, so no config.json): pytorch_model.bin.index.json and shards."""
    sd = {k: v.contiguous() for k, v in rm.state_dict().items()}
    names = sorted(sd)
    shards = {"pytorch_model-00001.bin": names[::2], "pytorch_model-00002.bin": names[1::2]}
    d.mkdir()
    for fname, keys in shards.items():
        torch.save({k: sd[k] for k in keys}, d / fname)
    index = {"metadata": {"total_size": 0}, "weight_map": {}}
    index["weight_map"] = {k: fname for fname, keys in shards.items() for k in keys}
    (d / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return d


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_colossalchat_reward_model_loads_with_its_value_head(tmp_path, tied):
    """Its rewards are value_head(the last real token's state) of transformers' LlamaModel on
    the same weights: saved as the booster shards it (no config.json: config= says the shape,
    as ColossalChat's RewardModel(pretrained, config=) takes it), in a directory with its
    config.json as safetensors, and as one torch file of the state dict."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    cfg = hf_config(tied)
    ref_model = ColossalRM(cfg).eval()
    ids, mask = right_padded()
    ref = ref_model(ids, mask)
    sd = {k: v.contiguous() for k, v in ref_model.state_dict().items()}
    assert "model.embed_tokens.weight" in sd and "value_head.bias" in sd

    shards = booster_dir(ref_model, tmp_path / "modeling")
    with_config = tmp_path / "with_config"
    with_config.mkdir()
    cfg.save_pretrained(with_config)  # config.json, copied beside the weights
    save_file(sd, with_config / "model.safetensors")
    single = tmp_path / "rm.pt"
    torch.save(sd, single)

    for build in (
        lambda: RewardModel(pretrained=with_config),
        lambda: load_reward_model(with_config)[0],
        lambda: RewardModel(pretrained=shards, config=cfg),
        lambda: RewardModel(pretrained=single, config=cfg),
    ):
        model = build()
        assert torch.equal(model.head.weight, ref_model.value_head.weight)
        assert torch.equal(model.head.bias, ref_model.value_head.bias)
        assert model.backbone.config.tie_embeddings == tied
        diff = (model(ids, mask) - ref).abs().max().item()
        assert diff < 1e-5, diff
    c = load(with_config)
    assert c.head == "value_head" and c.kind is None and c.format == "hf"
    with pytest.raises(UsageError, match="modeling: neither params.json .* pass config="):
        RewardModel(pretrained=shards)  # the shape is nowhere in the booster's files
    with pytest.raises(UsageError, match=r"rm\.pt is a state dict .* pass config="):
        RewardModel(pretrained=single)


def test_a_transformers_llamamodel_directory_loads(tmp_path):
    """LlamaModel.save_pretrained writes names without "model.": the same backbone, the same
    last hidden states as transformers' (its LM head, which it has none of, zero when untied)."""
    torch.manual_seed(0)
    for tied in (True, False):
        hf = transformers.LlamaModel(hf_config(tied)).eval()
        d = tmp_path / f"llama_model_{tied}"
        hf.save_pretrained(d)
        c = load(d)
        assert c.head == "random" and not c.heads
        ids, mask = right_padded()
        with torch.no_grad():
            ref = hf(ids, attention_mask=mask).last_hidden_state
            ours = c.backbone.hidden_states(ids, mask)
        real = mask.bool()
        assert (ours[real] - ref[real]).abs().max().item() < 1e-5
        assert tied or not c.backbone.output.weight.any()
        rm = RewardModel(pretrained=d)  # a backbone: a new head, as load says
        assert rm.head.weight.abs().max() < 0.2


def test_torch_dtype_is_honoured_and_other_keywords_refused(tmp_path):
    """ColossalChat passes from_pretrained's keywords through: torch_dtype sets the backbone's
    dtype (the head stays float32, as its value_head does); one nothing here would honour is
    refused by name, never ignored."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_config(False))
    hf.save_pretrained(tmp_path / "hf")
    fp32 = RewardModel(pretrained=tmp_path / "hf")
    for dtype in (torch.bfloat16, "bfloat16"):
        bf16 = RewardModel(pretrained=tmp_path / "hf", torch_dtype=dtype)
        assert {p.dtype for p in bf16.backbone.parameters()} == {torch.bfloat16}
        assert bf16.head.weight.dtype == torch.float32
    stories = shared_path("llama2c", "stories260K", "stories260K.bin")
    assert RewardModel(pretrained=stories, dtype=torch.float16).backbone.norm.weight.dtype == (
        torch.float16
    )
    with torch.no_grad():
        bf16.head.weight.copy_(fp32.head.weight)
        ids, mask = right_padded()
        assert (bf16(ids, mask) - fp32(ids, mask)).abs().max() < 0.1  # bf16's rounding
    new = LMRegularizedRewardModel(config=hf_config(True), torch_dtype=torch.bfloat16)
    assert new.backbone.output.weight.dtype == torch.bfloat16
    for kwargs in (dict(use_flash_attention_2=True), dict(trust_remote_code=True)):
        with pytest.raises(UsageError) as e:
            RewardModel(pretrained=tmp_path / "hf", **kwargs)
        assert f"({next(iter(kwargs))}=...): not honoured" in str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match="torch_dtype 'int8'"):
        RewardModel(pretrained=tmp_path / "hf", torch_dtype="int8")


def test_a_tensor_nothing_reads_is_refused_by_name(tmp_path):
    """A weight the loader has no place for (here a bias LLaMA has not) is one line naming the
    file and the tensor; RoPE's inv_freq buffers, which DROPPED lists, load."""
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_config(False))
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    d = tmp_path / "hf"
    hf.config.save_pretrained(d)
    for name in ("pooler.dense.weight", "model.layers.0.self_attn.q_proj.bias"):
        torch.save(dict(sd, **{name: torch.zeros(64)}), d / "pytorch_model.bin")
        for read in (lambda p: RewardModel(pretrained=p), load_reward_model):
            with pytest.raises(UsageError) as e:
                read(d)
            msg = str(e.value)
            assert str(d) in msg and f"tensor {name} has no place" in msg and "\n" not in msg
    old = dict(sd, **{"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    torch.save(old, d / "pytorch_model.bin")
    assert torch.equal(load(d).backbone.norm.weight, sd["model.norm.weight"])
