"""runtime.auto_dtype: `--dtype auto` is bf16 where it pays: on a GPU that supports it, and on a
CPU that multiplies bf16 natively (what the CPU's flags say, whatever machine runs the test) for
a model wide enough (runtime.BF16_MIN_DIM); fp32 elsewhere, the default model included.
runtime.with_dtype applies the rule once the model exists, and an explicit --dtype always wins.
Under bf16 autocast the rewards and the frozen layers' cache stay within bf16's rounding of
fp32's, and the reward is fp32."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import nanorm.build
from data.pairs import PairDataset, write_pairs
from model import ModelConfig
from nanorm.base import runtime
from nanorm.cache import FrozenCache, build, cache_key
from reward import RewardModel

V = 97


@pytest.fixture
def cpu(monkeypatch):
    """Pretend a CPU: set(flags) -> what torch's probe and /proc/cpuinfo report."""

    def make(flags, mkldnn=True):
        flags = set(flags)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: "avx512_bf16" in flags)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: "amx_tile" in flags)
        monkeypatch.setattr(runtime, "cpu_flags", lambda: flags)
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: mkldnn)

    return make


@pytest.mark.parametrize(
    "flags, mkldnn, want",
    [
        ({"avx512f", "avx512_bf16"}, True, "bfloat16"),  # AMD Zen 4, Intel Cooper Lake
        ({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, True, "bfloat16"),  # Sapphire Rapids
        ({"amx_bf16"}, True, "bfloat16"),  # torch's probe silent, the kernel's flags speak
        ({"avx2", "fma"}, True, "float32"),  # no native bf16: converting costs more than it saves
        ({"avx512f", "avx512_vnni"}, True, "float32"),  # AVX-512 alone is not bf16
        ({"avx512f", "avx512_bf16"}, False, "float32"),  # no oneDNN: no bf16 matmul kernel
    ],
)
def test_auto_on_cpu_follows_the_bf16_flags(cpu, flags, mkldnn, want):
    cpu(flags, mkldnn)
    assert runtime.auto_dtype("cpu") == want
    proc = runtime.setup_processes(SimpleNamespace(device="cpu", dtype="auto"))
    assert proc.dtype == want
    assert isinstance(proc.ctx, torch.autocast) == (want == "bfloat16")
    # an explicit dtype is never overridden: the exactness tests' fp32 path
    explicit = runtime.setup_processes(SimpleNamespace(device="cpu", dtype="float32"))
    assert explicit.dtype == "float32" and not isinstance(explicit.ctx, torch.autocast)


NANO = ModelConfig(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=V, multiple_of=32)
SMOLLM2 = ModelConfig(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, hidden_dim=1536, vocab_size=V)
SHAPES = [  # (config, bf16 on a CPU with native bf16): bench/README.md's training-step table
    (NANO, False),  # train_rm's default model: 0.75x fp32's tokens/s in bf16
    (ModelConfig(dim=288, n_layers=6, n_heads=6, vocab_size=V, multiple_of=32), False),
    (ModelConfig(dim=512, n_layers=8, n_heads=8, vocab_size=V, multiple_of=32), True),
    (SMOLLM2, True),
    (ModelConfig(dim=512, n_heads=8, hidden_dim=128, vocab_size=V), False),  # a narrow FFN
]


@pytest.mark.parametrize("config, wide", SHAPES)
def test_auto_on_cpu_is_bf16_for_wide_models_on_bf16_hardware(cpu, config, wide):
    cpu({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})  # native bf16
    assert runtime.auto_dtype("cpu", config) == ("bfloat16" if wide else "float32")
    cpu({"avx2", "fma"})  # none: bf16 is converted around every product, at any width
    assert runtime.auto_dtype("cpu", config) == "float32"
    cpu({"avx512_bf16"}, mkldnn=False)  # no oneDNN, no bf16 matmul kernel
    assert runtime.auto_dtype("cpu", config) == "float32"


def test_auto_on_cuda_keeps_the_gpu_rule(cpu, monkeypatch):
    cpu({"avx512_bf16"})  # the CPU's flags do not decide for a GPU
    for supported, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        for config in (None, NANO, SMOLLM2):  # on a GPU bf16 pays at any width
            assert runtime.auto_dtype("cuda", config) == want
            assert runtime.auto_dtype("cuda:1", config) == want
    assert runtime.auto_dtype("mps") == runtime.auto_dtype("mps", SMOLLM2) == "float32"


def procs(device="cpu"):
    return runtime.Processes(False, 0, 0, 1, device, "bfloat16", torch.autocast("cpu"))


@pytest.mark.parametrize("native", [True, False])
def test_with_dtype_decides_from_the_model_and_explicit_options_win(cpu, native):
    cpu({"avx512_bf16"} if native else {"avx2"})
    for config, wide in SHAPES:
        proc = runtime.with_dtype(procs(), "auto", config)
        want = "bfloat16" if native and wide else "float32"
        assert proc.dtype == want and isinstance(proc.ctx, torch.autocast) == (want == "bfloat16")
        assert proc.device == "cpu" and proc.world == 1  # the rest of proc is kept
        for option in ("float32", "bfloat16"):  # never overridden, whatever the shape
            explicit = runtime.with_dtype(procs(), option, config)
            assert explicit.dtype == option
            assert isinstance(explicit.ctx, torch.autocast) == (option == "bfloat16")
    bf16 = runtime.with_dtype(procs(), "bfloat16", NANO).ctx
    assert bf16.device == "cpu" and bf16.fast_dtype == torch.bfloat16


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # a CPU machine builds it all the same
def test_with_dtype_on_cuda_autocasts_there(cpu, monkeypatch):
    cpu({"avx2"})
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    proc = runtime.with_dtype(procs("cuda:0"), "auto", NANO)
    assert proc.dtype == "bfloat16" and proc.ctx.device == "cuda"


def test_the_real_cpu_flags_agree_with_torch():
    """The kernel's flags and torch's probe (cpuinfo) read the same CPU."""
    flags = runtime.cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags on this system")
    assert torch.cpu._is_avx512_bf16_supported() == ("avx512_bf16" in flags)
    want = "bfloat16" if (runtime.BF16_CPU_FLAGS & flags) else "float32"
    if torch.backends.mkldnn.is_available():
        assert runtime.auto_dtype("cpu") == runtime.auto_dtype("cpu", SMOLLM2) == want
    assert runtime.auto_dtype("cpu", NANO) == "float32"  # the default run, on any CPU


def tiny(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=V, hidden_dim=128)
    rm = RewardModel.from_config(cfg).eval()
    with torch.no_grad():
        rm.head.weight.normal_()  # a unit head makes reward errors visible
    return rm


def test_bf16_autocast_rewards_are_fp32_within_bf16_rounding():
    rm = tiny()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, V, (8, 40), generator=g)
    mask = torch.ones_like(tokens)
    mask[4:, 30:] = 0  # some rows padded
    with torch.no_grad():
        r32 = rm(tokens, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            r16 = rm(tokens, mask)
    assert r32.dtype == r16.dtype == torch.float32  # the head runs in fp32 (reward.apply_head)
    assert not torch.equal(r16, r32)  # autocast did compute in bf16
    # bf16 keeps 8 bits (relative 2^-8 = 0.4% per rounding) over 3 layers: a few per cent of
    # the rewards' scale, never more
    scale = r32.abs().max()
    assert (r16 - r32).abs().max() <= 0.03 * scale
    d32, d16 = r32[:, None] - r32[None], r16[:, None] - r16[None]  # every pair's difference
    clear = d32.abs() > 0.06 * scale
    assert torch.equal(d32[clear].sign(), d16[clear].sign())


@pytest.mark.parametrize("amx", [False, True])
def test_bf16_attention_on_a_cpu_without_amx_runs_in_fp32(monkeypatch, amx):
    """Under bf16 autocast, model._sdpa's output is bf16 either way; without AMX it is fp32
    SDPA of the bf16 inputs rounded once (bit for bit), with AMX the bf16 kernel's. Gradients
    reach q, k and v in their own dtype."""
    import torch.nn.functional as F

    import model

    monkeypatch.setattr(model, "_CPU_ATTENTION_FP32", not amx)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 24, 16, generator=g) for h in (4, 2, 2))
    q, k, v = (t.bfloat16().requires_grad_() for t in (q, k, v))
    mask = torch.rand(2, 1, 24, 24, generator=g) < 0.7
    mask[..., 0] = True  # every query reads a key
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model._sdpa(q, k, v, mask, enable_gqa=True)
    qf, kf, vf = (t.detach().float() for t in (q, k, v))
    fp32 = F.scaled_dot_product_attention(qf, kf, vf, mask, enable_gqa=True).bfloat16()
    bf16 = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), mask, enable_gqa=True)
    assert y.dtype == torch.bfloat16 and not torch.equal(fp32, bf16)  # the kernels differ
    assert torch.equal(y, bf16 if amx else fp32)
    y.float().square().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in (q, k, v))


def test_cache_built_under_bf16_autocast_is_fp32s_within_rounding(tmp_path):
    g = np.random.default_rng(0)
    items = [tuple(g.integers(1, V, int(n)) for n in g.integers(1, 30, 3)) for _ in range(13)]
    write_pairs(tmp_path / "d.npz", items, V)
    data = PairDataset(tmp_path / "d.npz")
    rm = tiny()
    nanorm.build.train_top_layers(rm, 1)
    quiet = lambda *a: None
    build(rm.backbone, data, "train", 2, tmp_path / "f32", 0, torch.float16, say=quiet)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    build(rm.backbone, data, "train", 2, tmp_path / "b16", 0, torch.float16, say=quiet, ctx=bf16)
    a = FrozenCache(tmp_path / "f32", "train", 2).states.float()
    b = FrozenCache(tmp_path / "b16", "train", 2).states.float()
    assert a.shape == b.shape and not torch.equal(a, b)
    assert ((a - b).norm(dim=1) <= 0.03 * a.norm(dim=1)).all()  # per token, relative


def test_cache_key_holds_the_dtype_and_fp32s_key_is_unchanged(tmp_path):
    (tmp_path / "ckpt").write_bytes(b"weights")
    k = cache_key(tmp_path / "ckpt", first=2)
    assert k == cache_key(tmp_path / "ckpt", first=2, dtype="float32")  # earlier fp32 caches
    assert cache_key(tmp_path / "ckpt", first=2, dtype="bfloat16") != k
