"""The Triton AdamATan2 kernel (training/optim_triton.py) on CPU tensors, through Triton's interpreter
(``TRITON_INTERPRET=1``): it equals the torch path to fp32 rounding over several steps (shapes that are not
multiples of the block, weight decay on / off, custom betas / a / b, lr changed per step, NaN gradients,
non-contiguous gradients); its atan2 against torch's; and the same kernel compiles for CUDA targets (sm_80,
sm_90) without a GPU, so a compile-only failure cannot hide behind the interpreter. Skipped without triton
(the ``test`` extra installs it on Linux x86-64)."""

import contextlib
import importlib
import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

pytest.importorskip("triton")

from training import optim as O  # noqa: E402
from training.optim import AdamATan2  # noqa: E402


@contextlib.contextmanager
def _interpret_mode():
    """Triton decides compiled vs interpreted when a kernel is defined, from TRITON_INTERPRET: set it around the
    definitions of this file's kernels only."""
    prev = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if prev is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = prev


with _interpret_mode():
    import triton
    import triton.language as tl

    # training.optim_triton defines its kernels at import; the fixture below swaps in the interpreted ones
    OT = importlib.import_module("training.optim_triton")

    @triton.jit
    def _atan2_kernel(y_ptr, x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs, OT._atan2(tl.load(y_ptr + offs, mask=mask), tl.load(x_ptr + offs, mask=mask)), mask=mask
        )

    @triton.jit
    def _downcast_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, OT._downcast(tl.load(x_ptr + offs, mask=mask), tl.bfloat16), mask=mask)


@pytest.fixture(scope="module", autouse=True)
def _interpreted_kernel():
    """This file's tests run the interpreted kernel (re-imported with TRITON_INTERPRET=1); the compiled one is put
    back afterwards. pytest imports every test file before running any, so switching at import would leave every
    later test of the process on the interpreter, the CUDA ones included (which the interpreter also runs, on
    host copies): the first GPU run's Triton CUDA test ran interpreted that way (2026-11-26)."""
    with _interpret_mode():
        importlib.reload(OT)
    assert OT.INTERPRETED and O.triton_module() is OT
    yield
    importlib.reload(OT)  # as the process's own TRITON_INTERPRET says (unset: compiled)


SHAPES = [(64, 32), (7,), (3, 5, 2), (1025,), (2049, 3), (1,)]  # 1025 / 6147: one element past a block


def _pair(shapes, seed=0, **kw):
    torch.manual_seed(seed)
    ps_t = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ps_r = [torch.nn.Parameter(p.detach().clone()) for p in ps_t]
    return ps_t, ps_r, AdamATan2(ps_t, impl="triton", **kw), AdamATan2(ps_r, impl="torch", **kw)


def _grad(p):
    """Gradients over many magnitudes (1e-6 .. 1), with exact zeros."""
    scale = 10.0 ** torch.randint(-6, 1, p.shape).float()
    g = torch.randn(p.shape) * scale
    return torch.where(torch.rand(p.shape) < 0.05, torch.zeros(()), g)


def _run(ps_t, ps_r, opt_t, opt_r, steps=8, lrs=None):
    for k in range(steps):
        for a, b in zip(ps_t, ps_r):
            a.grad = _grad(a)
            b.grad = a.grad.clone()
        if lrs is not None:
            for opt in (opt_t, opt_r):
                for g in opt.param_groups:
                    g["lr"] = lrs[k]
        opt_t.step()
        opt_r.step()


def _assert_same(ps_t, ps_r, opt_t, opt_r):
    for a, b in zip(ps_t, ps_r):
        st, sr = opt_t.state[a], opt_r.state[b]
        assert st["step"].item() == sr["step"].item()
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6), (a.shape, (a - b).abs().max().item())
        # moments: ulp-level absolute differences (torch's CPU lerp may fuse a multiply-add; |g| <= ~4 here)
        assert torch.allclose(st["exp_avg"], sr["exp_avg"], atol=1e-7, rtol=1e-6)
        assert torch.allclose(st["exp_avg_sq"], sr["exp_avg_sq"], atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_triton_kernel_matches_torch_path(weight_decay):
    ps_t, ps_r, opt_t, opt_r = _pair(SHAPES, lr=1e-2, betas=(0.9, 0.95), weight_decay=weight_decay)
    assert (opt_t.implementation, opt_r.implementation) == ("triton", "torch")
    before = [p.detach().clone() for p in ps_t]
    _run(ps_t, ps_r, opt_t, opt_r)
    _assert_same(ps_t, ps_r, opt_t, opt_r)
    assert all(not torch.equal(a, b) for a, b in zip(ps_t, before))  # it did update


def test_bf16_parameters_round_to_nearest_like_the_torch_path():
    """bf16 parameters (computed in fp32, stored once per step): a weight-decay step smaller than half an ulp
    leaves them where the torch path leaves them. The interpreter's plain fp32 -> bf16 cast truncates (the GPU's
    is cvt.rn, to nearest): before the kernel rounded on the bits, every parameter moved an ulp towards 0 per step
    here (20 ulps after 20 steps), so the tested kernel did not behave as the GPU's."""
    torch.manual_seed(0)
    shapes = [(64, 32), (7,), (1025,)]
    ps_t = [torch.nn.Parameter(torch.randn(s).bfloat16()) for s in shapes]
    ps_r = [torch.nn.Parameter(p.detach().clone()) for p in ps_t]
    before = [p.detach().clone() for p in ps_t]
    kw = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    opt_t, opt_r = AdamATan2(ps_t, impl="triton", **kw), AdamATan2(ps_r, impl="torch", **kw)
    assert opt_t.implementation == "triton"
    for k in range(20):
        for a, b in zip(ps_t, ps_r):
            a.grad = (torch.randn(a.shape) * 1e-3).bfloat16()
            b.grad = a.grad.clone()
        for opt in (opt_t, opt_r):
            opt.param_groups[0]["lr"] = 1e-3 * (k + 1) / 20
            opt.step()
    for a, b, a0 in zip(ps_t, ps_r, before):
        assert a.dtype == torch.bfloat16 and opt_t.state[a]["exp_avg"].dtype == torch.bfloat16
        ulp = 2.0 ** (torch.frexp(b.detach().float())[1] - 8).float()  # bf16 spacing at |b|
        # the torch path rounds after every op (decay, then the step): at most 2 ulps apart measured, mostly equal
        off = (a.float() - b.float()).abs() / ulp
        assert off.max() <= 3 and off.mean() < 0.1, (off.max().item(), off.mean().item())
        assert (a.float() - a0.float()).abs().max() < 0.05  # 20 steps of at most ~lr / (1 - beta1^t) each
        assert not torch.equal(a, a0) or a.numel() < 10


def test_kernel_downcast_is_torchs_round_to_nearest():
    x = torch.cat(
        [
            torch.randn(5000) * torch.exp(3 * torch.randn(5000)),
            torch.tensor(
                [
                    float("nan"),
                    float("inf"),
                    -float("inf"),
                    0.0,
                    -0.0,
                    3.3895e38,
                    -3.3895e38,
                    1e-40,
                    1.00390625,
                    1.01171875,
                    1.0 + 2**-8 + 2**-20,
                ]
            ),
        ]
    )  # ties, sticky bit
    out = torch.empty(len(x), dtype=torch.bfloat16)
    with _no_warnings():
        _downcast_kernel[(triton.cdiv(len(x), 1024),)](x, out, len(x), BLOCK=1024)
    ref = x.bfloat16()
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out[~ref.isnan()].view(torch.int16), ref[~ref.isnan()].view(torch.int16))


def test_triton_kernel_custom_hyperparameters_and_lr_per_step():
    lrs = [0.05 * (k + 1) / 6 for k in range(6)]
    ps_t, ps_r, opt_t, opt_r = _pair(SHAPES[:4], seed=1, lr=0.05, betas=(0.8, 0.99), weight_decay=0.3, a=1.27, b=0.5)
    _run(ps_t, ps_r, opt_t, opt_r, steps=6, lrs=lrs)
    _assert_same(ps_t, ps_r, opt_t, opt_r)
    # beta1 >= 0.5: torch.lerp's other branch (g - (g - m)(1 - w))
    ps_t, ps_r, opt_t, opt_r = _pair(SHAPES[:4], seed=2, lr=1e-2, betas=(0.3, 0.9), weight_decay=0.0)
    _run(ps_t, ps_r, opt_t, opt_r, steps=4)
    _assert_same(ps_t, ps_r, opt_t, opt_r)


def test_params_without_grad_and_uneven_step_counts():
    """A parameter that skips a step keeps its own step count (its bias corrections differ from the others')."""
    ps_t, ps_r, opt_t, opt_r = _pair([(5,), (1030,)], seed=3, lr=1e-2)
    for k in range(5):
        for i, (a, b) in enumerate(zip(ps_t, ps_r)):
            a.grad = None if (i == 0 and k in (1, 2)) else _grad(a)
            b.grad = None if a.grad is None else a.grad.clone()
        opt_t.step()
        opt_r.step()
    assert opt_t.state[ps_t[0]]["step"].item() == 3 and opt_t.state[ps_t[1]]["step"].item() == 5
    _assert_same(ps_t, ps_r, opt_t, opt_r)


def test_non_contiguous_gradient_and_nan_gradient():
    """A non-contiguous gradient takes the torch math for that tensor (same result); a NaN gradient gives NaN
    parameters in both paths (never hidden by the kernel's atan2)."""
    ps_t, ps_r, opt_t, opt_r = _pair([(6, 4), (9,)], seed=4, lr=1e-2)
    for k in range(3):
        g0 = torch.randn(4, 6).t()  # a transposed view: not contiguous
        g1 = torch.randn(9)
        if k == 2:
            g1[3] = float("nan")
        ps_t[0].grad, ps_r[0].grad = g0, g0.clone()
        ps_t[1].grad, ps_r[1].grad = g1, g1.clone()
        opt_t.step()
        opt_r.step()
    assert torch.allclose(ps_t[0], ps_r[0], atol=1e-6, rtol=1e-6)
    nan_t, nan_r = torch.isnan(ps_t[1]), torch.isnan(ps_r[1])
    assert nan_t[3] and torch.equal(nan_t, nan_r)
    assert torch.allclose(ps_t[1][~nan_t], ps_r[1][~nan_r], atol=1e-6, rtol=1e-6)


class _no_warnings:
    """No RuntimeWarning (0 / 0, overflow) from the interpreter's numpy arithmetic."""

    def __enter__(self):
        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error", RuntimeWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def test_kernel_atan2_against_torch():
    torch.manual_seed(5)
    n = 50_000
    y = torch.randn(n) * torch.exp(4 * torch.randn(n))
    x = torch.randn(n) * torch.exp(4 * torch.randn(n))
    inf, nan = float("inf"), float("nan")
    sy = torch.tensor([0.0, 1.0, -1.0, 0.0, 3.0, -3.0, 1e-30, 1e30, inf, 2.0, nan, 1.0, 5.0, -5.0])
    sx = torch.tensor([0.0, 0.0, 0.0, -1.0, 3.0, -3.0, 1e30, 1e-30, 1.0, inf, 1.0, nan, -1e-3, 1e-3])
    y, x = torch.cat([y, sy]), torch.cat([x, sx])
    out = torch.empty_like(y)
    with _no_warnings():
        _atan2_kernel[(triton.cdiv(len(y), 1024),)](y, x, out, len(y), BLOCK=1024)
    ref = torch.atan2(y.double(), x.double())
    finite = torch.isfinite(ref)
    assert (out.double() - ref)[finite].abs().max().item() < 4e-7  # torch's own fp32 atan2: ~1.3e-7
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert out[n + 0] == 0 and out[n + 1] == pytest.approx(math.pi / 2) and out[n + 3] == pytest.approx(math.pi)


def test_kernel_compiles_for_cuda_targets_without_a_gpu(tmp_path):
    """Compile (not run) the kernel for sm_80 / sm_90 with the ptxas that the triton wheel ships: what the
    interpreter cannot check (constexpr globals, dtypes, IEEE div / sqrt, no FMA contraction). A fresh process,
    since this one holds the interpreted kernel."""
    script = textwrap.dedent("""
        import sys
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from training import optim_triton as OT
        assert not OT.INTERPRETED
        if "nvidia" not in triton.backends.backends:
            print("SKIP: this triton has no NVIDIA backend"); sys.exit(0)
        scalars = ["n_elements", "decay", "w1", "beta2", "w2", "den_scale", "neg_step"]
        for dtype, arch in (("fp32", 90), ("bf16", 90), ("fp32", 80)):
            sig = {k: "*" + dtype for k in ("p_ptr", "g_ptr", "m_ptr", "v_ptr")}
            sig.update({k: "i32" if k == "n_elements" else "fp32" for k in scalars}, BLOCK="constexpr")
            try:
                src = ASTSource(fn=OT._adam_atan2_kernel, signature=sig, constexprs={"BLOCK": OT.BLOCK_SIZE})
            except TypeError as e:
                print(f"SKIP: this triton's compile API differs ({e})"); sys.exit(0)
            k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": False})
            ptx = k.asm["ptx"]
            assert k.asm.get("cubin"), "no cubin"
            assert "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx, "expected IEEE division and square root"
            assert "fma" not in ptx and ".ftz" not in ptx, "expected no FMA contraction and no flush-to-zero"
        print("OK")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    if r.stdout.startswith("SKIP"):
        pytest.skip(r.stdout.strip()[6:])
    assert r.stdout.strip().endswith("OK")
