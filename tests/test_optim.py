"""AdamATan2: the PyTorch implementation equals the adam-atan2 package's update (first bias correction in the
step size), hand-computed and in an independent numpy reference over 40 steps; lr as tensor / changed per step;
state round trip; implementation selection (auto / fused / triton / torch) and its errors; on CUDA, the fused
kernel of the adam-atan2 package against its own formula and against the torch path, and the Triton kernel against
the torch path (skipped without CUDA). The Triton kernel on CPU tensors (interpreter): tests/test_optim_triton.py."""

import copy
import math

import numpy as np
import pytest
import torch

from training import optim as O
from training.optim import AdamATan2, available_implementations, fused_available


def manual_adam_atan2(p0, grads, lrs, beta1=0.9, beta2=0.999, wd=1e-2, a=1.0, b=1.0):
    """Element-wise Python-float reference of the adam-atan2 package's update (first bias correction in the step
    size, outside the atan2)."""
    p = [float(x) for x in p0]
    m = [0.0] * len(p)
    v = [0.0] * len(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        for i in range(len(p)):
            p[i] *= 1 - lr * wd
            m[i] = beta1 * m[i] + (1 - beta1) * g[i]
            v[i] = beta2 * v[i] + (1 - beta2) * g[i] ** 2
            v_hat = v[i] / (1 - beta2**t)
            p[i] -= lr * a / (1 - beta1**t) * math.atan2(m[i], b * math.sqrt(v_hat))
    return torch.tensor(p, dtype=torch.float64)


GRADS = [[0.5, -1.0, 0.0, 2e-3], [0.1, -0.2, 3.0, -1e-3], [-0.7, 0.05, -1.0, 5e-3]]
P0 = [1.0, -2.0, 0.5, 0.0]


def run(opt_kwargs, lrs=None, dtype=torch.float64):
    p = torch.nn.Parameter(torch.tensor(P0, dtype=dtype))
    opt = AdamATan2([p], **opt_kwargs)
    for i, g in enumerate(GRADS):
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[i]
        p.grad = torch.tensor(g, dtype=dtype)
        opt.step()
    return p.detach(), opt


def test_matches_hand_computed_update_defaults():
    p, opt = run(dict(lr=0.01, impl="torch"))
    ref = manual_adam_atan2(P0, GRADS, [0.01] * 3)
    assert torch.allclose(p, ref, atol=1e-12, rtol=0)
    assert opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["weight_decay"] == 1e-2
    assert opt.state[next(iter(opt.state))]["step"].item() == 3
    # the update is bounded by lr * a * pi/2 per step (plus decay), unlike Adam with a tiny v
    assert (p - torch.tensor(P0, dtype=torch.float64)).abs().max() <= 3 * 0.01 * math.pi / 2 + 1e-3


def test_matches_hand_computed_update_custom_hparams():
    kw = dict(lr=0.05, betas=(0.8, 0.95), weight_decay=0.3, a=1.27, b=0.5, impl="torch")
    p, _ = run(kw)
    ref = manual_adam_atan2(P0, GRADS, [0.05] * 3, beta1=0.8, beta2=0.95, wd=0.3, a=1.27, b=0.5)
    assert torch.allclose(p, ref, atol=1e-12, rtol=0)


def numpy_package_formula(p0, grads, lrs, beta1, beta2, wd, a=1.0, b=1.0, bc1_inside=False):
    """Vectorised float64 numpy reference of the adam-atan2 package's update, independent of torch:
    p *= 1 - lr wd; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
    p -= lr a / (1 - beta1^t) * atan2(m, b sqrt(v / (1 - beta2^t))).
    ``bc1_inside``: the other formula, lr a * atan2(m / (1 - beta1^t), ...) (not the package's; for the check that
    the test tells the two apart)."""
    p = np.array(p0, dtype=np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        g = np.asarray(g, dtype=np.float64)
        p = p * (1 - lr * wd)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        bc1, bc2 = 1 - beta1**t, 1 - beta2**t
        den = b * np.sqrt(v / bc2)
        if bc1_inside:
            p = p - lr * a * np.arctan2(m / bc1, den)
        else:
            p = p - lr * a / bc1 * np.arctan2(m, den)
    return p


@pytest.mark.parametrize(
    "hp", [dict(beta1=0.9, beta2=0.95, wd=0.1), dict(beta1=0.8, beta2=0.999, wd=0.0, a=1.27, b=0.5)]
)
def test_torch_path_matches_numpy_package_formula_over_many_steps(hp):
    """40 steps, random gradients over six orders of magnitude (with exact zeros), a warmup-then-decay lr: the
    torch path is the package's formula to float64 rounding, and measurably not the bias-inside-atan2 one."""
    rng = np.random.default_rng(0)
    n, steps = 257, 40
    p0 = rng.standard_normal(n)
    grads = [rng.standard_normal(n) * 10.0 ** rng.integers(-6, 1, n) * (rng.random(n) > 0.05) for _ in range(steps)]
    lrs = [1e-2 * min(1.0, (k + 1) / 10) * (1 - 0.5 * k / steps) for k in range(steps)]
    p = torch.nn.Parameter(torch.tensor(p0))
    opt = AdamATan2(
        [p],
        lr=lrs[0],
        betas=(hp["beta1"], hp["beta2"]),
        weight_decay=hp["wd"],
        a=hp.get("a", 1.0),
        b=hp.get("b", 1.0),
        impl="torch",
    )
    for g, lr in zip(grads, lrs):
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.tensor(g)
        opt.step()
    ref = numpy_package_formula(p0, grads, lrs, **hp)
    np.testing.assert_allclose(p.detach().numpy(), ref, rtol=0, atol=1e-12)
    other = numpy_package_formula(p0, grads, lrs, **hp, bc1_inside=True)
    assert np.abs(other - ref).max() > 1e-3  # the two formulas differ far beyond the tolerance above


def test_float32_params_and_first_step_is_sign_like():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = AdamATan2([p], lr=0.1, weight_decay=0.0, impl="torch")
    p.grad = torch.tensor([1e-8, -5.0, 0.0])
    opt.step()
    # step 1: m = 0.1 g, sqrt(v_hat) = |g| -> lr / 0.1 * atan2(0.1 g, |g|) = +-lr * 10 atan(0.1) (0 for g = 0),
    # whatever |g|: no epsilon needed. (Bias-correcting m inside the atan2 would give +-lr * pi/4, 21% less.)
    step1 = 0.1 * 10 * math.atan(0.1)
    assert torch.allclose(p, torch.tensor([-step1, step1, 0.0]), atol=1e-7)


def test_lr_tensor_and_changed_each_step():
    lrs = [0.02, 0.01, 0.005]
    p, _ = run(dict(lr=torch.tensor(0.02), impl="torch"), lrs=[torch.tensor(x, dtype=torch.float64) for x in lrs])
    assert torch.allclose(p, manual_adam_atan2(P0, GRADS, lrs), atol=1e-12, rtol=0)
    p2, _ = run(dict(lr=0.02, impl="torch"), lrs=lrs)
    assert torch.allclose(p2, p, atol=1e-15)


def test_params_without_grad_are_skipped_and_groups_independent():
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    opt = AdamATan2([{"params": [a], "weight_decay": 0.0}, {"params": [b], "lr": 0.5}], lr=0.1, impl="torch")
    a.grad = torch.tensor([1.0, -1.0])
    opt.step()
    assert b not in opt.state and torch.equal(b.detach(), torch.ones(2))
    first = 10 * math.atan(0.1)  # step 1 moves lr * 10 atan(0.1) against the gradient's sign
    assert torch.allclose(a.detach(), torch.tensor([1 - 0.1 * first, 1 + 0.1 * first]))
    b.grad = torch.tensor([2.0, 0.0])
    opt.step()
    assert torch.allclose(b.detach(), torch.tensor([(1 - 0.5 * 1e-2) - 0.5 * first, 1 - 0.5 * 1e-2]))


def test_state_dict_round_trip_continues_exactly():
    p, opt = run(dict(lr=0.01, impl="torch"))
    q = torch.nn.Parameter(p.clone())
    opt2 = AdamATan2([q], lr=0.01, impl="torch")
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    p_cont = torch.nn.Parameter(p.clone())
    opt.param_groups[0]["params"] = [p_cont]
    opt.state = {p_cont: opt.state[next(iter(opt.state))]}
    g = torch.tensor([0.3, 0.3, -0.3, 0.0], dtype=torch.float64)
    p_cont.grad, q.grad = g.clone(), g.clone()
    opt.step()
    opt2.step()
    assert torch.equal(p_cont.detach(), q.detach())
    assert opt2.state[q]["step"].item() == 4


def test_invalid_arguments():
    p = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(ValueError, match="learning rate"):
        AdamATan2(p, lr=-1.0)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        AdamATan2(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="weight_decay"):
        AdamATan2(p, weight_decay=-0.1)
    with pytest.raises(ValueError, match=r"unknown impl 'cuda' \(auto, fused, triton, torch\)"):
        AdamATan2(p, impl="cuda")


def test_auto_selects_torch_for_cpu_parameters_and_names_it():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = AdamATan2([p])
    assert opt.impl == "auto" and opt.implementation == "torch"
    assert AdamATan2([p], impl="torch").implementation == "torch"
    avail = available_implementations()
    assert avail[-1] == "torch" and set(avail) <= {"fused", "triton", "torch"}
    assert ("fused" in avail) == fused_available()


@pytest.mark.skipif(fused_available(), reason="the fused backend is importable here")
def test_fused_requested_without_the_backend_names_the_command_that_builds_it():
    with pytest.raises(RuntimeError, match=r"backend is not importable.*--no-build-isolation adam-atan2"):
        AdamATan2([torch.nn.Parameter(torch.zeros(1))], impl="fused")


def test_fused_requested_for_cpu_parameters_or_a_not_1_is_refused(monkeypatch):
    """With a (fake) backend present, the checks that remain are CUDA parameters and a == b == 1."""
    monkeypatch.setattr(O, "_fused_backend", object())
    p = [torch.nn.Parameter(torch.zeros(1))]
    with pytest.raises(RuntimeError, match="needs every parameter on CUDA"):
        AdamATan2(p, impl="fused")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with pytest.raises(RuntimeError, match=r"a == b == 1 only \(got a=1.27, b=1.0\)"):
        AdamATan2(p, impl="fused", a=1.27)
    assert AdamATan2(p, impl="fused").implementation == "fused"
    # auto: fused for a == b == 1, and not for a group with a != 1 (Triton or torch there)
    mixed = AdamATan2([{"params": p}, {"params": [torch.nn.Parameter(torch.zeros(1))], "a": 1.27}])
    assert mixed.implementation.startswith("fused+")


def test_triton_requested_but_unusable_is_refused(monkeypatch):
    p = [torch.nn.Parameter(torch.zeros(1))]
    monkeypatch.setattr(O, "triton_module", lambda: None)
    monkeypatch.setattr(O, "_triton_error", "ModuleNotFoundError: No module named 'triton'")
    with pytest.raises(RuntimeError, match=r"triton is not importable \(ModuleNotFoundError.*pip install triton"):
        AdamATan2(p, impl="triton")
    assert AdamATan2(p).implementation == "torch"  # auto never needs it

    class FakeTriton:  # importable, compiled (not interpreted) kernel: CPU parameters cannot use it
        INTERPRETED = False
        SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

    monkeypatch.setattr(O, "triton_module", lambda: FakeTriton)
    with pytest.raises(RuntimeError, match=r"Triton kernel needs every parameter on CUDA \(or TRITON_INTERPRET=1"):
        AdamATan2(p, impl="triton")
    FakeTriton.INTERPRETED = True
    with pytest.raises(RuntimeError, match="not torch.float64; use impl='torch'"):
        AdamATan2([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], impl="triton")
    assert AdamATan2(p, impl="triton").implementation == "triton"
    assert AdamATan2(p).implementation == "torch"  # auto picks Triton for CUDA parameters only


def _package_formula(p, grads, lrs, beta1, beta2, wd):
    """The adam-atan2 package's CUDA kernel (csrc/adam_atan2.cu): the first bias correction is folded into the
    step size, p -= lr / (1 - beta1^t) * atan2(m, sqrt(v) / sqrt(1 - beta2^t)) -- not the same number as
    atan2(m / (1 - beta1^t), ...) while 1 - beta1^t is far from 1."""
    p = p.double().clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        g = g.double()
        p.mul_(1 - lr * wd)
        m.lerp_(g, 1 - beta1)
        v.lerp_(g * g, 1 - beta2)
        p.add_(torch.atan2(m, v.sqrt() / math.sqrt(1 - beta2**t)), alpha=-lr / (1 - beta1**t))
    return p


@pytest.mark.skipif(not fused_available(), reason="needs CUDA and the adam-atan2 package's backend")
def test_fused_kernel_computes_the_package_formula_on_cuda():
    torch.manual_seed(0)
    shapes = [(64, 32), (7,), (3, 5, 2)]
    ps = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
    p0 = [p.detach().clone() for p in ps]
    opt = AdamATan2(ps, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), impl="fused")
    assert opt.implementation == "fused"
    grads, lrs = [[] for _ in ps], []
    for step in range(20):
        lrs.append(1e-3 * (1 + step) / 20)
        opt.param_groups[0]["lr"] = lrs[-1]
        for i, p in enumerate(ps):
            p.grad = torch.randn_like(p) * 1e-3
            grads[i].append(p.grad.clone())
        opt.step()
    for p, q0, gs in zip(ps, p0, grads):
        assert torch.allclose(p.double(), _package_formula(q0, gs, lrs, 0.9, 0.95, 0.1), atol=5e-6, rtol=1e-6)


def _against_torch_path_on_cuda(impl, shapes, dtype, atol, rtol):
    """20 steps of ``impl`` and of the torch path from the same parameters and gradients (warm-up lr)."""
    torch.manual_seed(0)
    ps_i = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=dtype)) for s in shapes]
    ps_r = [torch.nn.Parameter(p.detach().clone()) for p in ps_i]
    opt_i = AdamATan2(ps_i, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), impl=impl)
    opt_r = AdamATan2(ps_r, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), impl="torch")
    assert (opt_i.implementation, opt_r.implementation) == (impl, "torch")
    if impl == "triton":  # the compiled kernel, not the interpreter (which also runs on CUDA tensors, via host copies)
        assert not O.triton_module().INTERPRETED
    for step in range(20):
        for pi, pr in zip(ps_i, ps_r):
            g = torch.randn_like(pi) * 1e-3
            pi.grad, pr.grad = g.clone(), g.clone()
        for opt in (opt_i, opt_r):
            opt.param_groups[0]["lr"] = 1e-3 * (1 + step) / 20
            opt.step()
    for pi, pr in zip(ps_i, ps_r):
        diff = (pi.float() - pr.float()).abs()
        worst = (diff / (atol + rtol * pr.float().abs())).max().item()
        print(f"[optim] {impl} {dtype}: max |diff| {diff.max().item():.3g}, worst diff / tolerance {worst:.3f}")
        assert worst <= 1.0, (diff.max().item(), worst)


@pytest.mark.skipif(not fused_available(), reason="needs CUDA and the adam-atan2 package's backend")
def test_fused_matches_torch_path_on_cuda():
    """The torch path computes the package's formula: fp32 rounding-level agreement with its kernel over 20
    steps (the kernel's fma lerp / contraction vs separate torch ops: an ulp or so of |p| per step at most, so
    20 ulps of |p| after 20 steps; an absolute 1e-6 failed on an H100 at 1.43e-6, |p| up to ~4)."""
    _against_torch_path_on_cuda(
        "fused", [(64, 32), (7,), (3, 5, 2)], torch.float32, 1e-8, 20 * torch.finfo(torch.float32).eps
    )


@pytest.mark.skipif(not (torch.cuda.is_available() and O.triton_module() is not None), reason="needs CUDA and triton")
def test_triton_matches_torch_path_on_cuda():
    # fp32: rounding-level differences; bf16: the torch path rounds to bf16 after every op, Triton once
    shapes = [(64, 32), (7,), (3, 5, 2), (4097,)]
    _against_torch_path_on_cuda("triton", shapes, torch.float32, 1e-6, 0.0)
    _against_torch_path_on_cuda("triton", shapes, torch.bfloat16, 1e-2, 2e-2)
