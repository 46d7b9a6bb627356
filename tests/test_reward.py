"""reward.py against closed forms, HF's LlamaForSequenceClassification, and stories260K."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    CHOSEN,
    PROMPTS,
    REJECTED,
    pad,
    shared_path,
    tiny_config,
    tiny_hf_config,
    tiny_model,
)

import reward
from model import Transformer
from nanorm.base.command import UsageError
from nanorm.ckpt import load_reward_model, save_checkpoint
from nanorm.score import main
from reward import LMRegularizedRewardModel, RewardModel, accuracy, pairwise_loss

V, EOS = 61, 2
tiny = tiny_model  # RewardModel or LMRegularizedRewardModel as its first argument


def count_backbone_calls(monkeypatch, model):
    calls, inner = [], model.backbone.hidden_states
    monkeypatch.setattr(
        model.backbone,
        "hidden_states",
        lambda x, *a, **k: calls.append(x.shape) or inner(x, *a, **k),
    )
    return calls


# ---------------------------------------------------------------- pooling and padding
def test_head_init():
    model = RewardModel.from_config(tiny_config(dim=256, n_layers=1, hidden_dim=32))
    w = model.head.weight
    assert w.shape == (1, 256) and torch.equal(model.head.bias, torch.zeros(1))
    assert abs(w.std().item() * 257 - 1) < 0.15  # std 1/(dim+1); 256 draws: ~4.4% noise


@torch.no_grad()
def test_reward_is_padding_invariant_and_pad_eq_eos():
    model = tiny(RewardModel)
    torch.manual_seed(1)
    seqs = [torch.randint(3, V, (n,)).tolist() + [EOS] for n in (9, 4, 13, 1)]
    alone = torch.stack([model(torch.tensor([s]))[0] for s in seqs])
    # without a mask the reward is the head at the last position
    h = model.backbone.hidden_states(torch.tensor([seqs[0]]))
    assert torch.allclose(alone[0], model.head(h[0, -1])[0], atol=1e-6)
    for side in ("left", "right"):
        for pad_id in (0, EOS, 17):
            tokens, mask = pad(seqs, side, pad_id, T=18)
            diff = (model(tokens, mask) - alone).abs().max().item()
            assert diff < 1e-5, (side, pad_id, diff)
    # what reading at "the last token that is not pad_id" would do with pad == eos: it skips
    # the EOS (and, right-padded, every token equal to EOS) and reads another token
    tokens, mask = pad(seqs, "right", EOS, T=18)
    h = model.backbone.hidden_states(tokens, mask)
    by_id = (torch.arange(18) * (tokens != EOS)).argmax(-1)
    wrong = model.head(h[torch.arange(4), by_id]).squeeze(-1)
    assert (wrong - alone).abs().max().item() > 1e-2


@torch.no_grad()
def test_forward_pair_is_one_call_equal_to_two(monkeypatch):
    model = tiny(RewardModel)
    torch.manual_seed(2)
    chosen, cmask = pad([torch.randint(3, V, (n,)).tolist() for n in (5, 11)], "right")
    rejected, rmask = pad([torch.randint(3, V, (n,)).tolist() for n in (8, 3)], "left")
    ref_c, ref_r = model(chosen, cmask), model(rejected, rmask)
    calls = count_backbone_calls(monkeypatch, model)
    r_c, r_r = model.forward_pair(chosen, cmask, rejected, rmask)
    assert calls == [(4, 11)]  # both halves, padded to the longer one, in one call
    assert (r_c - ref_c).abs().max() < 1e-5 and (r_r - ref_r).abs().max() < 1e-5


# ---------------------------------------------------------------- Hugging Face parity
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@torch.no_grad()
def test_hf_sequence_classification_parity(tmp_path, tied, kv_heads):
    transformers = pytest.importorskip("transformers", reason="parity tests need transformers")
    pytest.importorskip("safetensors", reason="parity tests need safetensors")
    PAD = 0  # HF pools at the rightmost token != pad_token_id: PAD must not occur in the text
    cfg = tiny_hf_config(num_hidden_layers=3, num_key_value_heads=kv_heads, num_labels=1,
                         tie_word_embeddings=tied, pad_token_id=PAD)  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForSequenceClassification(cfg).eval()
    hf.score.weight.normal_()  # HF initialises it at std 0.02; a unit head shows errors
    hf.save_pretrained(tmp_path)
    model = RewardModel(pretrained=tmp_path)
    assert model.backbone.config.n_kv_heads == kv_heads == hf.config.num_key_value_heads
    assert torch.equal(model.head.weight, hf.score.weight)
    assert torch.equal(model.head.bias, torch.zeros(1))

    seqs = [torch.randint(1, 101, (n,)).tolist() for n in (17, 6, 40, 1)]
    right, rmask = pad(seqs, "right", PAD)
    ref = hf(input_ids=right, attention_mask=rmask).logits.squeeze(-1)  # (B,)
    left, lmask = pad(seqs, "left", PAD)
    for tokens, mask in ((right, rmask), (left, lmask)):
        diff = (model(tokens, mask) - ref).abs().max().item()
        print(f"max |reward - HF| = {diff:.2e}")
        assert diff < 1e-5


# ---------------------------------------------------------------- stories260K
def test_stories260k_padding_invariance_and_pad_eq_eos():
    from data.tokenizer import load_tokenizer

    model = RewardModel(pretrained=shared_path("llama2c", "stories260K", "stories260K.bin"))
    tok = load_tokenizer(shared_path("llama2c", "stories260K", "tok512.bin"))
    assert tok.pad_id == tok.eos_id  # the case where pooling by pad id goes wrong
    torch.manual_seed(0)
    with torch.no_grad():
        model.head.weight.normal_(std=0.1)  # rewards of order 1
        texts = [
            "Once upon a time, there was a little girl named Lily.",
            "She loved to play.",
            "The cat sat on the mat and looked at the big red ball for a long time.",
        ]
        seqs = [tok.encode(t, bos=True, eos=True) for t in texts]
        alone = torch.stack([model(torch.tensor([s]))[0] for s in seqs])
        for side in ("left", "right"):
            tokens, mask = pad(seqs, side, tok.pad_id)
            assert (model(tokens, mask) - alone).abs().max().item() < 1e-5, side
        chosen, cmask = pad(seqs[:2], "right", tok.pad_id)
        rejected, rmask = pad(seqs[1:], "left", tok.pad_id)
        r_c, r_r = model.forward_pair(chosen, cmask, rejected, rmask)
    assert (torch.cat([r_c, r_r]) - alone[[0, 1, 1, 2]]).abs().max().item() < 1e-5


# ---------------------------------------------------------------- losses
RC = torch.tensor([1.0, 0.0, -2.0, 3.0, 0.25])
RR = torch.tensor([0.0, 0.0, 1.0, 0.5, 0.25])


def softplus(x):  # log(1 + e^x) in float64
    return math.log1p(math.exp(x))


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def grads(fn, rc=RC, rr=RR, **kw):
    rc, rr = rc.clone().requires_grad_(), rr.clone().requires_grad_()
    loss = fn(rc, rr, **kw)
    loss.backward()
    return loss.item(), rc.grad, rr.grad


def logsig(rc, rr, **kw):
    return pairwise_loss("logsig", rc, rr, **kw)


def test_logsig_hand_values():
    for rc, rr, want in ((0.0, 0.0, math.log(2)), (1.0, 0.0, 0.3132617), (0.0, 3.0, 3.0485874)):
        assert abs(logsig(torch.tensor([rc]), torch.tensor([rr])).item() - want) < 1e-6


@pytest.mark.parametrize("kind", ["logsig", "logexp", "bce"])
@pytest.mark.parametrize("use_margin", [False, True])
@pytest.mark.parametrize("coef", [0.0, 0.1])
def test_pairwise_loss_and_gradient_closed_form(kind, use_margin, coef):
    """The docstring's claim: the three kinds are one function of d = r_c - r_r - m, with the
    gradient -sigmoid(-d) / B on r_c, and centering adds 2 coef (r_c + r_r) / B to both."""
    m = torch.tensor([0.5, 0.0, 1.0, -1.0, 2.0]) if use_margin else torch.zeros(5)
    n = len(RC)
    fn = lambda rc, rr, **kw: pairwise_loss(kind, rc, rr, **kw)
    loss, g_c, g_r = grads(fn, margin=m if use_margin else None, center_coef=coef)
    d = (RC - RR - m).tolist()
    s = (RC + RR).tolist()
    expected = sum(softplus(-x) for x in d) / n + coef * sum(x * x for x in s) / n
    assert abs(loss - expected) < 1e-6
    exp_c = torch.tensor([-sigmoid(-x) / n + 2 * coef * y / n for x, y in zip(d, s, strict=True)])
    exp_r = torch.tensor([sigmoid(-x) / n + 2 * coef * y / n for x, y in zip(d, s, strict=True)])
    assert torch.allclose(g_c, exp_c, atol=1e-7) and torch.allclose(g_r, exp_r, atol=1e-7)


def test_loss_kinds_agree_and_stay_finite():
    torch.manual_seed(0)
    rc, rr = torch.randn(64) * 5, torch.randn(64) * 5
    ref = grads(logsig, rc, rr)
    for kind in ("logexp", "bce"):
        got = grads(lambda a, b, kind=kind: pairwise_loss(kind, a, b), rc, rr)
        assert abs(ref[0] - got[0]) < 1e-6, kind
        assert torch.allclose(ref[1], got[1], atol=1e-7) and torch.allclose(
            ref[2], got[2], atol=1e-7
        )
    # differences of 1e4 either way, and a tie: the naive formula overflows, ours do not
    rc, rr = torch.tensor([1e4, -1e4, 0.0]), torch.zeros(3)
    assert torch.isinf(torch.log(1 + torch.exp(rr - rc))).any()
    for kind in ("logsig", "logexp", "bce"):
        loss, g_c, g_r = grads(lambda a, b, kind=kind: pairwise_loss(kind, a, b), rc, rr)
        assert abs(loss - (1e4 + math.log(2)) / 3) < 1e-2, kind
        assert torch.allclose(g_c, torch.tensor([0.0, -1 / 3, -0.5 / 3]), atol=1e-7), kind
        assert torch.allclose(g_r, -g_c)


def test_bce_labels():
    ones, zeros = torch.ones(5), torch.zeros(5)
    bce = lambda y: pairwise_loss("bce", RC, RR, labels=y)
    assert abs(bce(ones) - logsig(RC, RR)) < 1e-6
    assert abs(bce(zeros) - logsig(RR, RC)) < 1e-6  # label 0: the swapped pair
    labels = torch.tensor([1, 0, 0, 1, 1])  # per pair: which of the two was preferred
    per_pair = [softplus(-(a - b) if y else a - b) for a, b, y in zip(RC, RR, labels, strict=True)]
    assert abs(bce(labels).item() - sum(per_pair) / 5) < 1e-6
    with pytest.raises(ValueError, match="labels are for the bce loss"):
        pairwise_loss("logsig", RC, RR, labels=ones)
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        pairwise_loss("hinge", RC, RR)


def test_accuracy_ties_are_wrong():
    assert accuracy(RC, RR).item() == pytest.approx(2 / 5)  # pairs 0 and 3; ties 1 and 4 lose
    assert accuracy(torch.zeros(4), torch.zeros(4)).item() == 0.0


# ---------------------------------------------------------------- LM-regularized reward model
def test_lm_regularized_loss_terms_by_hand(monkeypatch, pair_batch):
    model = tiny(LMRegularizedRewardModel)
    calls = count_backbone_calls(monkeypatch, model)
    total, stats = model.loss(*pair_batch, lm_coef=0.3)
    assert calls == [(4, 8)]

    # by hand, one unpadded row at a time: response token t is predicted by the logits at t - 1
    with torch.no_grad():
        per_pair = []
        for p, c in zip(PROMPTS, CHOSEN, strict=True):
            ids = p + c
            logp = torch.log_softmax(model.backbone(torch.tensor([ids]))[0], dim=-1)  # (T, V)
            nll = [-logp[t - 1, ids[t]].item() for t in range(len(p), len(ids))]
            per_pair.append(sum(nll) / len(nll))  # response tokens only, prompt excluded
        lm = sum(per_pair) / len(per_pair)  # each pair weighs the same
        score = lambda rows: torch.stack([model(torch.tensor([ids]))[0] for ids in rows])
        r_c = score([p + c for p, c in zip(PROMPTS, CHOSEN, strict=True)])
        r_r = score([p + r for p, r in zip(PROMPTS, REJECTED, strict=True)])
    assert abs(stats["lm_loss"].item() - lm) < 1e-5
    assert torch.allclose(stats["r_chosen"], r_c, atol=1e-5)
    assert torch.allclose(stats["r_rejected"], r_r, atol=1e-5)
    rm = logsig(r_c, r_r).item()
    assert abs(stats["rm_loss"].item() - rm) < 1e-5
    assert abs(total.item() - (rm + 0.3 * lm)) < 1e-5


def full_logits_lm_loss(model, chosen, chosen_mask, response_mask):
    """The straightforward reference: (B, T, V) logits, masked CE, mean per pair then over pairs."""
    logits = model.backbone(chosen, chosen_mask)[:, :-1]  # (B, T-1, V): t predicts t + 1
    ce = F.cross_entropy(logits.transpose(1, 2), chosen[:, 1:], reduction="none")  # (B, T-1)
    target = response_mask[:, 1:].float()
    return ((ce * target).sum(1) / target.sum(1).clamp(min=1)).mean()


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_chunked_lm_loss_equals_full_logits(monkeypatch, chunk):
    """The LM term is computed at the response tokens only, `chunk` at a time, each chunk
    recomputed in backward: its value and every gradient equal the full-logits computation."""
    monkeypatch.setattr(reward, "LM_CHUNK", chunk)
    model = tiny(LMRegularizedRewardModel, tie_embeddings=False)
    torch.manual_seed(3)
    prompts = [torch.randint(3, V, (n,)).tolist() for n in (4, 1, 9)]
    responses = [torch.randint(3, V, (n,)).tolist() + [EOS] for n in (6, 2, 11)]
    chosen, cmask = pad([p + r for p, r in zip(prompts, responses, strict=True)])
    response = torch.zeros_like(chosen)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        response[i, len(p) : len(p) + len(r)] = 1

    def lm_and_grads(fn):
        model.zero_grad()
        loss = fn()
        loss.backward()
        return loss.item(), {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }

    rejected, rmask = pad([p + r[::-1] for p, r in zip(prompts, responses, strict=True)])
    got_loss, got = lm_and_grads(
        lambda: model.loss(chosen, cmask, rejected, rmask, response, lm_coef=0.7)[0]
    )
    ref_loss, ref = lm_and_grads(
        lambda: (
            0.7 * full_logits_lm_loss(model, chosen, cmask, response)
            + logsig(*model.forward_pair(chosen, cmask, rejected, rmask))
        )
    )
    assert abs(got_loss - ref_loss) < 1e-5
    assert got.keys() == ref.keys()
    for name in ref:
        assert (got[name] - ref[name]).abs().max() < 1e-5, name


def test_lm_loss_keeps_no_logits_for_backward(monkeypatch, pair_batch):
    """What autograd saves outside the checkpointed chunks: no tensor with a vocabulary axis
    (a (tokens, vocab) logits or softmax), so the backward's memory does not grow with it."""
    monkeypatch.setattr(reward, "LM_CHUNK", 2)
    model = tiny(LMRegularizedRewardModel, vocab_size=997)
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        total, _ = model.loss(*pair_batch, lm_coef=1.0)
    assert shapes and not [s for s in shapes if s[-1] == 997], shapes
    total.backward()  # the chunks' logits are made again, one chunk at a time
    assert model.backbone.output.weight.grad.abs().sum() > 0


def test_lm_regularized_gradients_and_pooling(pair_batch):
    model = tiny(LMRegularizedRewardModel)
    chosen, cmask, rejected, rmask, _ = pair_batch
    total, _ = model.loss(chosen, cmask, rejected, rmask, cmask, lm_coef=0.0)
    total.backward()
    assert model.head.weight.grad.abs().sum() > 0
    assert not model.backbone.output.weight.grad.any()  # lm_coef 0: the LM head learns nothing
    # pooling is RewardModel's: same backbone and head weights, same rewards
    rm = RewardModel(model.backbone)
    with torch.no_grad():
        rm.head.weight.copy_(model.head.weight)
        assert torch.equal(rm(rejected, rmask), model(rejected, rmask))


# ---------------------------------------------------------------- saving and loading
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


@pytest.mark.parametrize("cls", [RewardModel, LMRegularizedRewardModel])
def test_save_load_roundtrip(tmp_path, cls):
    model = tiny(cls, tie_embeddings=True, rope_scaling=LLAMA3_ROPE)
    path = tmp_path / "rm.pt"
    save_checkpoint(path, model)
    assert not (tmp_path / "rm.pt.tmp").exists()
    saved = torch.load(path, weights_only=True)
    assert saved["kind"] == cls.__name__ and saved["config"]["rope_scaling"] == LLAMA3_ROPE
    tokens, mask = pad([[1, 4, 9, 16, 25, 36], [1, 8, 27]], "left")
    ref = model(tokens, mask)
    # as save() wrote it, and beside training keys
    written = dict(saved)
    torch.save({**written, "tokenizer": "tok.bin", "step": 3}, tmp_path / "t.pt")
    for p in (path, tmp_path / "t.pt"):
        for loaded in (cls(pretrained=p), load_reward_model(p)[0]):
            assert type(loaded) is cls and not loaded.training
            assert loaded.backbone.output.weight is loaded.backbone.tok_embeddings.weight
            assert torch.equal(loaded(tokens, mask), ref)
    # another class starts from its backbone and scoring head (as a Critic from a reward model)
    other = LMRegularizedRewardModel if cls is RewardModel else RewardModel
    started = other(pretrained=path)
    assert torch.equal(started.head.weight, model.head.weight)
    assert torch.equal(
        RewardModel.forward(started, tokens, mask),
        RewardModel.forward(model, tokens, mask)
        - (model.head.bias if model.head.bias is not None else 0),
    )
    torch.save({"step": 1}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="not a checkpoint nanoRM reads"):
        load_reward_model(tmp_path / "bad.pt")


def test_from_backbone_checkpoint_llama2c_and_meta(tmp_path):
    torch.manual_seed(0)
    base = Transformer(tiny_config(hidden_dim=None, multiple_of=32, tie_embeddings=True)).eval()
    sd = base.state_dict()
    args = {k: getattr(base.config, k) for k in ("dim", "n_layers", "n_heads", "n_kv_heads")}
    llama2c = {"model": sd, "model_args": dict(args, vocab_size=V, hidden_dim=96, max_seq_len=64)}
    torch.save(llama2c, tmp_path / "ckpt.pt")
    meta = tmp_path / "meta"
    meta.mkdir()
    torch.save({k: v for k, v in sd.items() if k != "output.weight"}, meta / "consolidated.00.pth")
    (meta / "params.json").write_text(json.dumps(dict(args, vocab_size=-1, multiple_of=32)))
    x = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        ref = base.hidden_states(x)
        for path in (tmp_path / "ckpt.pt", meta):
            model = RewardModel(pretrained=path)
            assert (model.backbone.hidden_states(x) - ref).abs().max() < 1e-6, path
            assert model.head.weight.std() < 0.1  # a fresh head: nothing to load


# ---------------------------------------------------------------- command line
def test_command_line(tmp_path, capsys):
    from data.tokenizer import load_tokenizer

    tok_path = shared_path("llama2c", "stories260K", "tok512.bin")
    model = RewardModel(pretrained=shared_path("llama2c", "stories260K", "stories260K.bin"))
    torch.manual_seed(0)
    with torch.no_grad():
        model.head.weight.normal_(std=0.1)
    ckpt = tmp_path / "rm.pt"
    save_checkpoint(ckpt, model)  # without a dataset's meta: it carries no tokenizer
    tok = load_tokenizer(tok_path)

    args = ["--ckpt", str(ckpt), "--tokenizer", str(tok_path), "--prompt", "Once upon a time"]
    main([*args, "--response", "there was a cat."])
    printed = float(capsys.readouterr().out.split("reward:")[1])
    ids = tok.encode("Once upon a time", bos=True) + tok.encode("there was a cat.", eos=True)
    with torch.no_grad():
        assert abs(printed - model(torch.tensor([ids])).item()) < 1e-5

    # accuracy on a pairs file is eval_rm.py's alone: score.py says where it went
    with pytest.raises(UsageError, match="python eval_rm.py --ckpt"):
        main(["--ckpt", str(ckpt), "--pairs", str(tmp_path / "pairs.jsonl")])


# ----------------------------------------------------------------------------- a reward per step,
# a judge, an ensemble: each against a slow plain computation
STEP_ROWS = [[1, 5, 9, 11, 12, 13, 2], [1, 7, 14, 2], [1, 5, 20, 21, 22, 23, 24, 25, 2]]
STEP_ENDS = [[3, 5, 6], [2, 3, -1], [4, -1, -1]]  # each row's steps' last tokens; -1: none


@pytest.mark.parametrize("side", ["right", "left"])
def test_process_reward_is_the_head_at_each_step_end(side):
    prm = tiny_model(reward.ProcessRewardModel)
    tokens, mask = pad(STEP_ROWS, side)
    shift = (tokens.size(1) - mask.sum(1)) if side == "left" else torch.zeros(3, dtype=torch.long)
    ends = torch.tensor(STEP_ENDS)
    ends = torch.where(ends >= 0, ends + shift[:, None], ends)
    got = prm.step_scores(tokens, mask, ends)
    for b, row in enumerate(STEP_ROWS):  # each row alone, unpadded, every state computed
        h = prm.backbone.hidden_states(torch.tensor([row]))[0]
        for s, t in enumerate(STEP_ENDS[b]):
            if t >= 0:
                want = h[t] @ prm.head.weight[0] + prm.head.bias[0]
                assert math.isclose(got[b, s], want, rel_tol=1e-5, abs_tol=1e-5), (b, s)


def test_process_reward_loss_is_bce_over_the_real_steps_alone():
    prm = tiny_model(reward.ProcessRewardModel)
    tokens, mask = pad(STEP_ROWS)
    ends = torch.tensor(STEP_ENDS)
    labels = torch.tensor([[1.0, 0.75, 0.0], [1.0, 0.0, 0.3], [0.0, 1.0, 1.0]])
    loss, stats = prm.loss(tokens, mask, ends, labels)
    logits = prm.step_scores(tokens, mask, ends)
    sig = lambda x: 1 / (1 + math.exp(-x))
    flat = zip(logits.flatten().tolist(), labels.flatten().tolist(), ends.flatten(), strict=True)
    terms = [-(y * math.log(sig(x)) + (1 - y) * math.log(1 - sig(x))) for x, y, t in flat if t >= 0]
    assert len(terms) == 6
    assert math.isclose(loss.item(), sum(terms) / len(terms), rel_tol=1e-5)
    other = labels.clone()
    other[ends < 0] = 1 - other[ends < 0]  # the padded steps' labels are not read
    assert torch.equal(prm.loss(tokens, mask, ends, other)[0], loss)
    right = ((logits > 0) == (labels > 0.5))[ends >= 0].float().mean()
    assert stats["step_accuracy"] == right


def test_solution_reward_is_the_weakest_step_or_the_product():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(5, 4, generator=g)
    steps = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    for how, fold in (("min", min), ("prod", math.prod)):
        got = reward.solution_reward(p, steps, how)
        for b in range(5):
            real = [p[b, s].item() for s in range(4) if steps[b, s]]
            assert math.isclose(got[b].item(), fold(real), rel_tol=1e-6), (how, b)
    with pytest.raises(ValueError, match="min"):
        reward.solution_reward(p, steps, "max")


@pytest.mark.parametrize("side", ["right", "left"])
def test_generative_judge_is_p_yes_from_the_lm_head(side):
    judge = reward.GenerativeJudge(tiny_model(), yes_id=5, no_id=7)
    tokens, mask = pad(STEP_ROWS, side)
    got = judge(tokens, mask)
    for b, row in enumerate(STEP_ROWS):
        logits = judge.backbone(torch.tensor([row]))[0, -1]  # the full forward, row alone
        want = torch.softmax(logits.double(), -1)[5].item()
        assert math.isclose(got[b].item(), want, rel_tol=1e-4), b
    labels = torch.tensor([1, 0, 1])
    loss, stats = judge.loss(tokens, mask, labels)
    logits = judge.next_logits(tokens, mask)
    want = (
        -sum(torch.log_softmax(logits[b], -1)[5 if y else 7] for b, y in enumerate(labels.tolist()))
        / 3
    )
    assert math.isclose(loss.item(), want.item(), rel_tol=1e-5)
    says = (logits[:, 5] > logits[:, 7]).long()
    assert stats["accuracy"] == (says == labels).float().mean()


def test_a_few_judge_steps_say_yes_to_the_right_rows():
    judge = reward.GenerativeJudge(tiny_model(), yes_id=5, no_id=7).train()
    tokens, mask = pad(STEP_ROWS)
    labels = torch.tensor([1, 0, 1])
    opt = torch.optim.AdamW(judge.parameters(), lr=1e-2)
    for _ in range(20):
        loss, _ = judge.loss(tokens, mask, labels)
        opt.zero_grad(), loss.backward(), opt.step()
    p = judge.eval()(tokens, mask)
    assert p[0] > 0.5 and p[2] > 0.5 and p[1] < 0.1, p


def test_conservative_reward_rules_are_plain_statistics():
    g = torch.Generator().manual_seed(1)
    r = torch.randn(5, 6, generator=g) * 3
    for b in range(6):
        col = r[:, b].tolist()
        mean = sum(col) / 5
        std = math.sqrt(sum((x - mean) ** 2 for x in col) / 5)  # the members' own spread
        want = {"mean": mean, "min": min(col), "mean_minus_std": mean - 0.5 * std}
        for rule, w in want.items():
            got = reward.conservative_reward(r, rule, lam=0.5)[b].item()
            assert math.isclose(got, w, rel_tol=1e-5, abs_tol=1e-6), (rule, b)
    with pytest.raises(ValueError, match="rule"):
        reward.conservative_reward(r, "median")
    with pytest.raises(ValueError, match="rule"):
        reward.RewardEnsemble([tiny_model(RewardModel)], rule="max")


def test_an_ensemble_standardises_its_members_then_applies_its_rule():
    members = [tiny_model(RewardModel, seed=s) for s in range(3)]
    tokens, mask = pad(STEP_ROWS + [[1, 9, 9, 2], [1, 2]])
    raw = torch.stack([m(tokens, mask) for m in members])  # (3, 5)
    ens = reward.RewardEnsemble(members, rule="min")
    with torch.no_grad():
        ens.standardise(tokens, mask)
        z = ens.member_rewards(tokens, mask)
        want = (raw - raw.mean(1, keepdim=True)) / raw.std(1, keepdim=True)
        assert torch.allclose(z, want, atol=1e-5)
        assert torch.allclose(ens(tokens, mask), want.min(0).values, atol=1e-5)
        same = reward.RewardEnsemble([members[0]] * 3, rule="mean_minus_std", lam=2.0)
        same.standardise(tokens, mask)  # K copies of one model: no spread, the model itself
        assert torch.allclose(same(tokens, mask), want[0], atol=1e-5)
