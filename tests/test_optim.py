"""Optimizers against straightforward reference loops; state_dict round trips; schedule, scaler, clipper."""
import math

import pytest
import torch

from dsdata.train.clipping import DynamicGradClipper
from dsdata.train.optim import DeepOpt, LambdaOpt, WarmupCosineSchedule
from dsdata.train.precision import DynamicLossScaler

torch.set_num_threads(1)


def problem(seed=0):
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(5, 3, generator=gen, dtype=torch.float64), torch.randn(4, generator=gen, dtype=torch.float64)]
    grads = [[torch.randn_like(p) for p in params] for _ in range(30)]
    for g in grads[7]:
        g.mul_(25.0)  # a spike
    return params, grads


def run(opt_cls, params, grads, **kw):
    ps = [torch.nn.Parameter(p.clone()) for p in params]
    opt = opt_cls(ps, **kw)
    for step_grads in grads:
        for p, g in zip(ps, step_grads):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in ps], opt


def deepopt_reference(params, grads, lr, betas, beta2_final, T, eps, wd):
    out = []
    for i, p0 in enumerate(params):
        p = p0.clone().tolist() if p0.ndim == 1 else p0.clone().flatten().tolist()
        m = [0.0] * len(p)
        v = [0.0] * len(p)
        prod1 = prod2 = 1.0
        for t, step_grads in enumerate(grads, start=1):
            g = step_grads[i].flatten().tolist()
            s = min(t / T, 1.0)
            b1 = betas[0] * (1 - 0.01 * s)
            b2 = min(betas[1] + (beta2_final - betas[1]) * s, 1 - 1e-9)
            prod1 *= b1
            prod2 *= b2
            for j in range(len(p)):
                m[j] = b1 * m[j] + (1 - b1) * g[j]
                v[j] = b2 * v[j] + (1 - b2) * g[j] * g[j]
                mhat = m[j] / (1 - prod1)
                vhat = v[j] / (1 - prod2)
                p[j] = p[j] - lr * wd * p[j] - lr * mhat / (math.sqrt(vhat) + eps)
        out.append(torch.tensor(p, dtype=torch.float64).view(p0.shape))
    return out


def lambdaopt_reference(params, grads, lr, betas, eps, wd, max_trust=10.0):
    out = []
    for i, p0 in enumerate(params):
        p = p0.flatten().tolist()
        m = [0.0] * len(p)
        v = [0.0] * len(p)
        for t, step_grads in enumerate(grads, start=1):
            g = step_grads[i].flatten().tolist()
            u = []
            for j in range(len(p)):
                m[j] = betas[0] * m[j] + (1 - betas[0]) * g[j]
                v[j] = betas[1] * v[j] + (1 - betas[1]) * g[j] * g[j]
                u.append((m[j] / (1 - betas[0] ** t)) / (math.sqrt(v[j] / (1 - betas[1] ** t)) + eps) + wd * p[j])
            wn = math.sqrt(sum(x * x for x in p))
            un = math.sqrt(sum(x * x for x in u))
            trust = min(wn / un, max_trust) if wn > 0 and un > 0 else 1.0
            p = [p[j] - lr * trust * u[j] for j in range(len(p))]
        out.append(torch.tensor(p, dtype=torch.float64).view(p0.shape))
    return out


def test_deepopt_matches_reference_loop():
    params, grads = problem()
    kw = dict(lr=1e-2, betas=(0.9, 0.999), beta2_final=0.9999, schedule_steps=12, eps=1e-8, weight_decay=0.1)
    got, _ = run(DeepOpt, params, grads, **kw)
    want = deepopt_reference(params, grads, 1e-2, (0.9, 0.999), 0.9999, 12, 1e-8, 0.1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_deepopt_betas_follow_the_schedule_and_stay_below_one():
    group = {"betas": (0.9, 0.999), "beta2_final": 0.9999999999, "schedule_steps": 100}
    assert DeepOpt.betas_at(0, group) == (0.9, 0.999)
    b1, b2 = DeepOpt.betas_at(50, group)
    assert b1 == pytest.approx(0.9 * (1 - 0.005)) and 0.999 < b2 < 1
    b1, b2 = DeepOpt.betas_at(10_000, group)
    assert b1 == pytest.approx(0.891) and b2 <= 1 - 1e-9


def test_deepopt_with_constant_betas_is_adamw():
    params, grads = problem(1)
    got, _ = run(DeepOpt, params, grads, lr=1e-2, betas=(0.9, 0.99), beta2_final=0.99, schedule_steps=10**9,
                 eps=1e-8, weight_decay=0.05)
    want, _ = run(torch.optim.AdamW, params, grads, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-7, atol=1e-9)


def test_lambdaopt_matches_reference_loop():
    params, grads = problem(2)
    got, _ = run(LambdaOpt, params, grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    want = lambdaopt_reference(params, grads, 1e-2, (0.9, 0.999), 1e-6, 0.01)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("opt_cls,kw", [(DeepOpt, dict(lr=1e-2, schedule_steps=10, weight_decay=0.1)),
                                        (LambdaOpt, dict(lr=1e-2, weight_decay=0.1))])
def test_state_dict_round_trip_continues_exactly(opt_cls, kw):
    params, grads = problem(3)
    full, _ = run(opt_cls, params, grads, **kw)
    half, opt = run(opt_cls, params, grads[:13], **kw)
    state = opt.state_dict()
    assert all(torch.is_tensor(v) for s in state["state"].values() for v in s.values())
    ps = [torch.nn.Parameter(p.clone()) for p in half]
    resumed = opt_cls(ps, **kw)
    resumed.load_state_dict(state)
    for step_grads in grads[13:]:
        for p, g in zip(ps, step_grads):
            p.grad = g.clone()
        resumed.step()
    for a, b in zip(ps, full):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=0)


def test_warmup_then_cosine():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupCosineSchedule(opt, peak_lr=3e-4, warmup_steps=500, decay_steps=1000, min_ratio=0.1)
    lrs = [sched.lr_at(s) for s in range(1600)]
    assert lrs[0] == pytest.approx(3e-4 / 500) and lrs[499] == pytest.approx(3e-4)
    assert all(a < b for a, b in zip(lrs[:499], lrs[1:500]))
    assert lrs[1000] == pytest.approx(3e-4 * (0.1 + 0.9 * 0.5))
    assert lrs[1500] == pytest.approx(3e-5) and lrs[1599] == pytest.approx(3e-5)
    for _ in range(7):
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(lrs[7])
    other = WarmupCosineSchedule(opt, 3e-4, 500, 1000)
    other.load_state_dict(sched.state_dict())
    assert opt.param_groups[0]["lr"] == pytest.approx(lrs[7])


def test_loss_scaler_policy_matches_grad_scaler():
    defaults = DynamicLossScaler()
    assert defaults.scale == 2.0 ** 16 and defaults.growth_interval == 2000 and defaults.growth_factor == 2.0
    ours = DynamicLossScaler(growth_interval=20)  # short interval: same policy, fewer steps to test
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=20)
    assert ours.scale == 2.0 ** 16 == theirs.get_scale()
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    pattern = [False] * 20 + [True] + [False] * 19 + [True, True] + [False] * 20
    for overflow in pattern:
        skipped = ours.update(overflow)
        assert skipped == overflow
        theirs.scale(torch.ones(()))
        p.grad = torch.tensor([float("inf") if overflow else 1.0]) * theirs.get_scale()
        theirs.step(opt)
        theirs.update()
        assert ours.scale == theirs.get_scale()
    assert ours.scale == 2.0 ** 15  # 2^16 ×2 (20 clean) ÷2 ÷2 ÷2 (overflows) ×2 (20 clean)
    restored = DynamicLossScaler()
    restored.load_state_dict(ours.state_dict())
    assert restored.state_dict() == ours.state_dict()


def test_dynamic_clipper_threshold_and_clipping():
    clipper = DynamicGradClipper(max_norm=1.0, factor=0.8, window=100, min_history=50)
    for i in range(49):
        clipper.record(float(i + 1))
    assert clipper.threshold() == 1.0  # fixed until 50 norms are known
    clipper.record(50.0)
    assert clipper.threshold() == pytest.approx(0.8 * 25.5)
    for i in range(200):
        clipper.record(10.0 if i % 2 else 30.0)
    clipper.record(float("nan"))  # not counted
    assert len(clipper.history) == 100 and clipper.threshold() == pytest.approx(0.8 * 20.0)
    grads = [torch.full((4,), 10.0), torch.full((4,), 10.0)]
    total = float(torch.cat(grads).norm())
    limit = clipper.clip(grads, total)
    assert float(torch.cat(grads).norm()) == pytest.approx(limit, rel=1e-5)
