"""AdamATan2: the PyTorch implementation equals a hand-computed update; lr as tensor / changed per step;
state round trip; the fused CUDA kernel agrees with the fallback (skipped without CUDA + adam_atan2)."""
import copy
import math

import pytest
import torch

from training.optim import AdamATan2, fused_available


def manual_adam_atan2(p0, grads, lrs, beta1=0.9, beta2=0.999, wd=1e-2, a=1.0, b=1.0):
    """Element-wise Python-float reference."""
    p = [float(x) for x in p0]
    m = [0.0] * len(p)
    v = [0.0] * len(p)
    for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
        for i in range(len(p)):
            p[i] *= 1 - lr * wd
            m[i] = beta1 * m[i] + (1 - beta1) * g[i]
            v[i] = beta2 * v[i] + (1 - beta2) * g[i] ** 2
            m_hat = m[i] / (1 - beta1 ** t)
            v_hat = v[i] / (1 - beta2 ** t)
            p[i] -= lr * a * math.atan2(m_hat, b * math.sqrt(v_hat))
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
    p, opt = run(dict(lr=0.01, fused=False))
    ref = manual_adam_atan2(P0, GRADS, [0.01] * 3)
    assert torch.allclose(p, ref, atol=1e-12, rtol=0)
    assert opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["weight_decay"] == 1e-2
    assert opt.state[next(iter(opt.state))]["step"].item() == 3
    # the update is bounded by lr * a * pi/2 per step (plus decay), unlike Adam with a tiny v
    assert (p - torch.tensor(P0, dtype=torch.float64)).abs().max() <= 3 * 0.01 * math.pi / 2 + 1e-3


def test_matches_hand_computed_update_custom_hparams():
    kw = dict(lr=0.05, betas=(0.8, 0.95), weight_decay=0.3, a=1.27, b=0.5, fused=False)
    p, _ = run(kw)
    ref = manual_adam_atan2(P0, GRADS, [0.05] * 3, beta1=0.8, beta2=0.95, wd=0.3, a=1.27, b=0.5)
    assert torch.allclose(p, ref, atol=1e-12, rtol=0)


def test_float32_params_and_first_step_is_sign_like():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = AdamATan2([p], lr=0.1, weight_decay=0.0, fused=False)
    p.grad = torch.tensor([1e-8, -5.0, 0.0])
    opt.step()
    # step 1: m_hat = g, sqrt(v_hat) = |g| -> atan2(g, |g|) = +-pi/4 (0 for g = 0): no epsilon needed
    assert torch.allclose(p, torch.tensor([-0.1 * math.pi / 4, 0.1 * math.pi / 4, 0.0]), atol=1e-7)


def test_lr_tensor_and_changed_each_step():
    lrs = [0.02, 0.01, 0.005]
    p, _ = run(dict(lr=torch.tensor(0.02), fused=False), lrs=[torch.tensor(x, dtype=torch.float64) for x in lrs])
    assert torch.allclose(p, manual_adam_atan2(P0, GRADS, lrs), atol=1e-12, rtol=0)
    p2, _ = run(dict(lr=0.02, fused=False), lrs=lrs)
    assert torch.allclose(p2, p, atol=1e-15)


def test_params_without_grad_are_skipped_and_groups_independent():
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    opt = AdamATan2([{"params": [a], "weight_decay": 0.0}, {"params": [b], "lr": 0.5}], lr=0.1, fused=False)
    a.grad = torch.tensor([1.0, -1.0])
    opt.step()
    assert b not in opt.state and torch.equal(b.detach(), torch.ones(2))
    assert torch.allclose(a.detach(), torch.tensor([1 - 0.1 * math.pi / 4, 1 + 0.1 * math.pi / 4]))
    b.grad = torch.tensor([2.0, 0.0])
    opt.step()
    assert torch.allclose(b.detach(), torch.tensor([(1 - 0.5 * 1e-2) - 0.5 * math.pi / 4, 1 - 0.5 * 1e-2]))


def test_state_dict_round_trip_continues_exactly():
    p, opt = run(dict(lr=0.01, fused=False))
    q = torch.nn.Parameter(p.clone())
    opt2 = AdamATan2([q], lr=0.01, fused=False)
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
    if not fused_available():
        with pytest.raises(RuntimeError, match="adam-atan2"):
            AdamATan2(p, fused=True)


@pytest.mark.skipif(not fused_available(), reason="needs CUDA and the adam-atan2 package")
def test_fused_matches_fallback_on_cuda():
    torch.manual_seed(0)
    shapes = [(64, 32), (7,), (3, 5, 2)]
    ps_f = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
    ps_r = [torch.nn.Parameter(p.detach().clone()) for p in ps_f]
    opt_f = AdamATan2(ps_f, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    opt_r = AdamATan2(ps_r, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), fused=False)
    for step in range(20):
        for pf, pr in zip(ps_f, ps_r):
            g = torch.randn_like(pf) * 1e-3
            pf.grad, pr.grad = g.clone(), g.clone()
        for opt in (opt_f, opt_r):
            opt.param_groups[0]["lr"] = 1e-3 * (1 + step) / 20
        opt_f.step()
        opt_r.step()
    for pf, pr in zip(ps_f, ps_r):
        assert torch.allclose(pf, pr, atol=1e-6, rtol=0)
