"""lora.py: exact at init, merge equals the unmerged forward, only adapters train, it learns,
DDP over 2 gloo processes equals 1, partial merges, and the memory on SmolLM2-135M."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import pad, shared_path
from torch.nn.parallel import DistributedDataParallel as DDP

from model import ModelConfig, Transformer
from nanorm.base.checkpoints import load_transformer
from nanorm.lora import LoRALinear, add_lora, memory_report, memory_stats, merge_lora
from reward import RewardModel, pairwise_loss

CFG = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, max_seq_len=64)
PROJ = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


def tiny(cls=Transformer, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(**CFG)
    return (cls(cfg) if cls is Transformer else cls.from_config(cfg)).eval()


def tokens(seed=1, B=3, T=12):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG["vocab_size"], (B, T), generator=g)


def perturb(model, seed=2):
    """Random A and B: with B = 0 a merge would be trivially right."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_A.copy_(torch.randn(m.lora_A.shape, generator=g) * 0.1)
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.1)


def test_adapted_equals_base_at_init():
    model, x = tiny(), tokens()
    want = model(x)
    add_lora(model, rank=4, alpha=8)
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 7 * CFG["n_layers"]
    assert torch.equal(model(x), want)  # B = 0: exactly, not approximately


def test_merge_equals_unmerged_forward_and_keeps_keys():
    model, x = tiny(), tokens()
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    add_lora(model, rank=4, alpha=8)
    perturb(model)
    unmerged = model(x)
    assert (unmerged - tiny()(x)).abs().max() > 1e-3  # the adapters do change the output
    assert merge_lora(model) is model
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(model(x), unmerged, atol=1e-5, rtol=1e-5)
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes


def test_only_adapters_and_head_get_gradients(pair_batch):
    rm = tiny(RewardModel)
    adapters = add_lora(rm, rank=4, alpha=8)
    assert len(adapters) == 2 * 7 * CFG["n_layers"]
    chosen, cmask, rejected, rmask, _ = pair_batch
    pairwise_loss("logsig", *rm.forward_pair(chosen, cmask, rejected, rmask)).backward()
    got = {n for n, p in rm.named_parameters() if p.grad is not None}
    want = {n for n, p in rm.named_parameters() if n.endswith(("lora_A", "lora_B"))}
    assert got == want | {"head.weight", "head.bias"}
    for n, p in rm.named_parameters():
        if n not in got:
            assert not p.requires_grad and p.grad is None, n
    assert {id(p) for p in adapters} == {id(p) for n, p in rm.named_parameters() if n in want}


def test_lora_learns(pair_batch):
    rm = tiny(RewardModel)
    params = add_lora(rm, rank=4, alpha=8) + list(rm.head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2)
    chosen, cmask, rejected, rmask, _ = pair_batch
    losses = []
    for _ in range(8):
        loss = pairwise_loss("logsig", *rm.forward_pair(chosen, cmask, rejected, rmask))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


# ----------------------------------------------------------------------------- DDP
def ddp_batch():
    """4 pairs of different lengths, right-padded to one width."""
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, CFG["vocab_size"], (n,), generator=g).tolist() for n in range(3, 11)]
    chosen, cmask = pad(rows[:4], T=10)
    rejected, rmask = pad(rows[4:][::-1], T=10)
    return chosen, cmask, rejected, rmask


def ddp_model():
    rm = tiny(RewardModel)
    add_lora(rm, rank=4, alpha=8)
    perturb(rm)  # B != 0, so A gets a gradient from the first step
    # a constant on every reward cancels in r_c - r_r: the bias gets a zero gradient plus float
    # noise that differs between 1 and 2 processes, and AdamW would blow it up (as train_rm.py)
    rm.head.bias.requires_grad_(False)
    return rm.train()


def train_steps(model, chosen, cmask, rejected, rmask, steps=2):
    # SGD, whose step is the gradient times lr: what DDP must get right is the gradient (the
    # mean over both ranks' rows). AdamW divides each gradient by its own size, so an entry
    # whose gradient is float noise (summed in another order by 2 processes than by 1) gets a
    # full step of either sign, and the comparison would test the summation order
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(steps):
        # DDP's forward hook needs forward() itself: forward_pair runs the 2B rows in one call
        r = model(torch.cat([chosen, rejected]), torch.cat([cmask, rmask]))
        loss = pairwise_loss("logsig", *r.chunk(2))
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over ranks: the mean over the whole batch
        opt.step()


def adapter_state(rm):
    return {k: v.clone() for k, v in rm.state_dict().items() if "lora" in k or "head" in k}


def ddp_worker(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two processes on a shared 2-core machine
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rm = ddp_model()
    half = [t.chunk(world)[rank] for t in ddp_batch()]
    train_steps(DDP(rm), *half)
    if rank == 0:
        torch.save(adapter_state(rm), out)
    # both ranks leave together: a rank that tears gloo down while the other still talks to
    # it aborts ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_two_processes_equal_one(tmp_path):
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp.pt"
    mp.spawn(ddp_worker, args=(2, port, str(out)), nprocs=2, join=True)
    rm = ddp_model()
    before = adapter_state(rm)
    train_steps(rm, *ddp_batch())
    one, two = adapter_state(rm), torch.load(out, weights_only=True)
    assert one.keys() == two.keys() and any("lora_A" in k for k in one)
    assert max((one[k] - before[k]).abs().max() for k in one) > 1e-3  # the steps moved them
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-5, rtol=0, msg=k)


def test_partial_merge_leaves_other_layers():
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    add_lora(model, rank=4, alpha=8, layers=[1], targets=("wq", "w2"))
    assert not any(isinstance(m, LoRALinear) for m in model.layers[0].modules())
    assert not any(p.requires_grad for p in model.layers[0].parameters())  # frozen all the same
    perturb(model)
    after = merge_lora(model).state_dict()
    assert after.keys() == before.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"layers.1.attention.wq.weight", "layers.1.feed_forward.w2.weight"}


def test_smollm2_memory():
    """The figures lora.py's docstring quotes: full fine-tuning vs rank 8 on all 30 layers."""
    path = shared_path("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    rm = RewardModel(load_transformer(path))
    full = memory_stats(rm)
    print("\nSmolLM2-135M full fine-tuning:", memory_report(rm))
    add_lora(rm, rank=8, alpha=16)
    lora = memory_stats(rm)
    print("SmolLM2-135M LoRA r=8, 30 layers x 7 projections + head:", memory_report(rm))
    cfg = rm.backbone.config
    assert cfg.n_layers == 30
    kv = cfg.n_kv_heads * cfg.head_dim  # wk, wv: dim -> kv; wq, wo: dim -> dim
    per_layer = 8 * (2 * (cfg.dim + cfg.dim) + 2 * (cfg.dim + kv) + 3 * (cfg.dim + cfg.hidden_dim))
    assert lora["trainable"] == cfg.n_layers * per_layer + cfg.dim + 1  # + the head and its bias
    assert lora["full"] == full["trainable"] == full["full"]
    assert lora["adam_bytes"] < 0.02 * full["adam_bytes"]
