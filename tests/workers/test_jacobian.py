"""Input–output Jacobian singular values against the mathematics: orthogonal deep linear networks
are exactly isometric, Gaussian ones spread with depth (Pennington et al. 2017; Saxe et al.
2014), the Jacobian of a linear network is the product of its weights, and autodiff agrees with
finite differences, BatchNorm's batch statistics included."""

import math

import numpy as np
import pytest
import torch

from service.config import TrialConfig
from service.errors import InvalidInput
from workers import jacobian, nn

F64 = torch.float64


def network(seed=0, **fields):
    """A network of the config's spec, with parameters perturbed away from BatchNorm/LayerNorm's
    γ = 1, β = 0 so that the affine terms are exercised too."""
    c = TrialConfig(**{"dataset": "gaussian", **fields})
    spec = nn.make_spec(c)
    gen = torch.Generator().manual_seed(seed)
    params = nn.init_params(spec, c.init, c.init_gain, gen)
    for k in params:
        if k.startswith(("gamma", "beta", "b")) and not k.startswith("b_head"):
            params[k] = params[k] + 0.3 * torch.randn(params[k].shape, generator=gen)
    return spec, params, nn.init_state(spec)


def probe(n, d_in, seed=1, dtype=torch.float32):
    return torch.randn(n, d_in, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def linear_net(depth, init, seed=0, width=100):
    c = TrialConfig(
        depth=depth, width=width, activation="identity", norm="none", init=init, seed=seed,
        dataset="gaussian",
    )  # fmt: skip
    spec = nn.make_spec(c)
    params = nn.init_params(spec, init, 1.0, torch.Generator().manual_seed(seed))
    return spec, params, nn.init_state(spec)


# --- dynamical isometry of deep linear networks -----------------------------------------------


def test_orthogonal_deep_linear_network_has_every_singular_value_one():
    """J = W_50 ⋯ W_1 with Haar-orthogonal 100 × 100 factors is orthogonal: σ ≡ 1."""
    spec, params, state = linear_net(50, "orthogonal")
    sv = jacobian.jacobian_singular_values(spec, params, state, probe(100, 100), 4)
    assert sv.shape == (4, 100) and sv.dtype == np.float64
    assert np.abs(sv - 1.0).max() < 1e-5


def test_gaussian_deep_linear_spread_grows_with_depth():
    """With N(0, 1/d) weights the log-singular values of the product spread like the Lyapunov
    exponents of the product, ∝ depth: the std of log σ grows monotonically 5 → 20 → 50."""
    spread = []
    for depth in (5, 20, 50):
        per_seed = []
        for seed in range(3):
            spec, params, state = linear_net(depth, "gaussian", seed=seed)
            sv = jacobian.jacobian_singular_values(spec, params, state, probe(100, 100), 2)
            per_seed.append(np.log(sv).std(axis=1).mean())
        spread.append(np.mean(per_seed))
    assert spread[0] < spread[1] < spread[2], spread
    assert spread[0] > 1.0  # far from isometry already at depth 5 (orthogonal: ~1e-7)


def test_gaussian_linear_jacobian_moments_match_free_probability():
    """λ = σ² of J Jᵀ, J = W_L ⋯ W_1 with N(0, 1/d) entries: E[mean λ] = 1 exactly (each
    factor keeps E‖Wx‖² = ‖x‖²), and in the wide limit the variance of λ is L (Pennington et
    al. 2017; the free product of L Marchenko–Pastur laws, Fuss–Catalan, has m₂ = L + 1). Over 8
    seeds at d = 100: the mean within 4 standard errors of 1, the variance within 15% of L
    (finite-width corrections are O(L/d))."""
    for depth in (5, 20):
        m1, m2 = [], []
        for seed in range(8):
            spec, params, state = linear_net(depth, "gaussian", seed=seed)
            lam = jacobian.jacobian_singular_values(spec, params, state, probe(100, 100), 1)[0] ** 2
            m1.append(lam.mean())
            m2.append((lam**2).mean())
        se = np.std(m1, ddof=1) / np.sqrt(len(m1))
        assert abs(np.mean(m1) - 1.0) < 4 * se, (depth, np.mean(m1), se)
        if depth == 5:
            assert np.mean(m2) - np.mean(m1) ** 2 == pytest.approx(depth, rel=0.15)


def test_gaussian_linear_mean_log_singular_value_is_mean_log_det():
    """Σ_k log σ_k(J) = log |det J| = Σ_ℓ log |det W_ℓ| for square factors: an identity of every
    draw, not an expectation."""
    spec, params, state = linear_net(5, "gaussian", seed=3)
    sv = jacobian.jacobian_singular_values(spec, params, state, probe(100, 100), 1)
    logdet = sum(float(torch.linalg.slogdet(params[f"W{ell}"].to(F64))[1]) for ell in range(1, 6))
    assert np.log(sv[0]).sum() == pytest.approx(logdet, rel=1e-9)


@pytest.mark.parametrize("d_in,width", [(7, 5), (4, 6)])
def test_linear_jacobian_is_the_product_of_the_weights(d_in, width):
    c = TrialConfig(depth=3, width=width, activation="identity", norm="none", dataset="digits")
    spec = nn.make_spec(c)
    spec = nn.Spec(**{**spec.__dict__, "d_in": d_in})
    params = nn.init_params(spec, "gaussian", 1.0, torch.Generator().manual_seed(5))
    X = probe(6, d_in)
    J = jacobian.input_output_jacobian(spec, params, {}, X, 2)
    W = [params[f"W{ell}"].to(F64) for ell in (1, 2, 3)]
    product = W[2] @ W[1] @ W[0]  # (width, d_in)
    assert J.dtype == F64 and J.shape == (width, d_in)
    torch.testing.assert_close(J, product, rtol=1e-12, atol=1e-14)
    sv = jacobian.jacobian_singular_values(spec, params, {}, X, 3)
    expected = np.linalg.svd(product.numpy(), compute_uv=False)
    assert sv.shape == (3, min(d_in, width))
    for row in sv:
        np.testing.assert_allclose(row, expected, rtol=1e-12)
        assert (np.diff(row) <= 0).all()  # descending


# --- autodiff against finite differences --------------------------------------------------------


def finite_difference_jacobian(spec, params, state, X, i, h=1e-6):
    """Central differences of [h_L(X)]_i in x_i, the whole batch forwarded each time (the other
    samples fixed), float64 throughout."""
    p = {k: v.to(F64) for k, v in params.items()}
    s = {k: v.to(F64) for k, v in state.items()}
    X = X.to(F64)
    cols = []
    for j in range(X.shape[1]):
        plus, minus = X.clone(), X.clone()
        plus[i, j] += h
        minus[i, j] -= h
        up = jacobian.last_block_output(spec, p, s, plus)[i]
        down = jacobian.last_block_output(spec, p, s, minus)[i]
        cols.append((up - down) / (2 * h))
    return torch.stack(cols, dim=1)  # (d, d_in)


@pytest.mark.parametrize(
    "norm,order",
    [
        ("batch", "norm_act"),
        ("batch", "act_norm"),
        ("batch_scale", "norm_act"),
        ("layer", "norm_act"),
        ("layer_scale", "act_norm"),
        ("none", "norm_act"),
    ],
)
def test_jacobian_matches_finite_differences(norm, order):
    """Batch norms: sample i's own effect on the batch statistics is part of J_i (a per-sample
    Jacobian would miss it); per-sample norms: J_i from x_i alone equals the full-batch one."""
    spec, params, state = network(depth=3, width=6, activation="tanh", norm=norm, order=order)
    spec = nn.Spec(**{**spec.__dict__, "d_in": 5})
    params["W1"] = torch.randn(6, 5, generator=torch.Generator().manual_seed(9)) / math.sqrt(5)
    X = probe(8, 5)
    for i in (0, 5):
        J = jacobian.input_output_jacobian(spec, params, state, X, i)
        fd = finite_difference_jacobian(spec, params, state, X, i)
        torch.testing.assert_close(J, fd, rtol=1e-6, atol=1e-7)


def test_batch_norm_jacobian_differs_from_frozen_statistics():
    """The batch-statistics terms are not negligible: with n = 4 the Jacobian of BatchNorm
    through the batch differs from the one with the statistics frozen at their values."""
    spec, params, state = network(depth=1, width=3, activation="identity", norm="batch")
    spec = nn.Spec(**{**spec.__dict__, "d_in": 3})
    params["W1"] = torch.eye(3)
    X = probe(4, 3, dtype=F64)
    J = jacobian.input_output_jacobian(spec, params, state, X, 0)
    var = X.var(dim=0, unbiased=False)
    frozen = torch.diag(params["gamma1"].to(F64) / torch.sqrt(var + spec.eps))
    assert (J - frozen).abs().max() > 0.05
    # the exact derivative of (x_i − μ)/√(v + ε) in x_i, per feature (W = I, diagonal):
    # (1 − 1/n)/√(v+ε) − (x_i − μ)·(x_i − μ)/(n (v+ε)^{3/2})
    n, c = len(X), X[0] - X.mean(dim=0)
    exact = (1 - 1 / n) / torch.sqrt(var + spec.eps) - c * c / (n * (var + spec.eps) ** 1.5)
    torch.testing.assert_close(torch.diagonal(J), params["gamma1"].to(F64) * exact)
    assert (J - torch.diag(torch.diagonal(J))).abs().max() < 1e-12  # features stay separate


def test_every_family_says_the_width_and_norm_the_jacobian_reads():
    """The Net protocol's `width` and `norm` (workers/models/base.py): a Net built from a config
    and an nn.Spec wrapped by hand say them alike, so the Jacobian has no special case."""
    from workers.models import build

    for model in ("mlp", "resmlp", "cnn", "transformer"):
        c = TrialConfig(model=model, dataset="gaussian", depth=2, width=8, norm="layer")
        net = build(c)
        assert (net.width, net.norm) == (8, "layer"), model
    spec, _, _ = network(depth=2, width=6, norm="batch_scale")
    assert (jacobian.as_net(spec).width, jacobian.as_net(spec).norm) == (6, "batch_scale")


def test_a_resmlp_net_takes_the_generic_path_batch_statistics_included():
    """A residual MLP (built from its config, no nn.Spec given): J_i (width, d_in) through the
    batch's BatchNorm statistics equals finite differences of the whole batch's forward."""
    from workers.models import build

    c = TrialConfig(model="resmlp", dataset="gaussian", depth=2, width=6, norm="batch",
                    activation="tanh")  # fmt: skip
    net = build(c)
    params, state = net.init_params(torch.Generator().manual_seed(0)), net.init_state()
    X = probe(8, net.d_in)
    J = jacobian.input_output_jacobian(net, params, state, X, 3)
    assert J.shape == (6, net.d_in)
    torch.testing.assert_close(J, finite_difference_jacobian(net, params, state, X, 3),
                               rtol=1e-6, atol=1e-7)  # fmt: skip
    assert jacobian.jacobian_singular_values(net, params, state, X, 2).shape == (2, 6)


# --- the record's contract ------------------------------------------------------------------------


def test_zero_samples_and_bad_counts():
    spec, params, state = network(depth=2, width=4, norm="batch")
    X = probe(5, 100)
    assert jacobian.jacobian_singular_values(spec, params, state, X, 0).shape == (0, 4)
    for bad in (6, -1, 1.5, True):
        with pytest.raises(InvalidInput) as exc:
            jacobian.jacobian_singular_values(spec, params, state, X, bad)
        assert exc.value.field == "jacobian_samples" and "batch_size = 5" in exc.value.message


def test_nonfinite_network_gives_nan_rows_and_leaves_parameters_alone():
    spec, params, state = network(depth=2, width=4, activation="tanh", norm="none")
    params = {k: v.requires_grad_() for k, v in params.items()}
    before = {k: v.detach().clone() for k, v in params.items()}
    X = probe(5, 100)
    sv = jacobian.jacobian_singular_values(spec, params, state, X, 2)
    assert np.isfinite(sv).all() and (sv > 0).all()
    for k, v in params.items():
        assert v.dtype == torch.float32 and v.requires_grad and v.grad is None
        assert torch.equal(v.detach(), before[k])
    broken = {**params, "W2": torch.full_like(params["W2"], math.inf)}
    assert np.isnan(jacobian.jacobian_singular_values(spec, broken, state, X, 2)).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    spec, params, state = network(depth=10, width=32, activation="tanh", norm="batch")
    X = probe(16, 100)
    cpu = jacobian.jacobian_singular_values(spec, params, state, X, 3)
    gpu = jacobian.jacobian_singular_values(
        spec, nn.to_device(params, "cuda"), nn.to_device(state, "cuda"), X.cuda(), 3
    )
    np.testing.assert_allclose(gpu, cpu, rtol=1e-9)


# --- the record, its transport and its storage ------------------------------------------------


def assert_same_bits(a, b) -> None:
    """The same float64 arrays bit for bit: unlike ==, NaN payloads and −0.0 count."""
    a, b = (np.ascontiguousarray(x, "<f8") for x in (a, b))
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.array_equal(a.view("<u8"), b.view("<u8")), (a, b)


def test_records_carry_the_spectra_through_transport_into_the_store(sqlite_url):
    """fit() with jacobian_samples = k and spectra: the record holds the Jacobian's singular
    values of the first k probe samples and every Gram's eigenvalues; Tune's transport and the
    store keep them bit-exact."""
    import pickle

    from service.spec import parse_spec
    from service.store import Store
    from workers.train import Trial, fit
    from workers.trainable import from_transport, to_transport

    params = dict(dataset="gaussian", depth=3, width=8, batch_size=10, epochs=0, norm="batch")
    (rec,) = fit({**params, "jacobian_samples": 3, "spectra": True})
    sv = rec["jacobian_singular_values"]
    assert sv.shape == (3, 8) and sv.dtype == np.float64
    trial = Trial(TrialConfig(**params))
    direct = jacobian.jacobian_singular_values(
        trial.spec, trial.params, trial.state, trial.probe[0], 3
    )
    assert_same_bits(sv, direct)  # the first k probe samples, untrained network
    keys = {"spectrum/linear", "spectrum/norm", "spectrum/act", "spectrum/weight"}
    assert keys <= set(rec), "spectra=True must put the Gram spectra in the record"
    assert "jacobian_singular_values" not in next(iter(fit(params)))
    back = from_transport(pickle.loads(pickle.dumps(to_transport(rec, trial_id=1, device="cpu"))))
    for key in (*keys, "jacobian_singular_values"):
        assert back[key].dtype == np.float64
        assert_same_bits(back[key], rec[key])
    with Store(sqlite_url) as store:
        spec = {"name": "j", "parameters": {**params, "jacobian_samples": 3, "spectra": True}}
        sweep = store.create_sweep(parse_spec(spec))
        tid = store.list_trials(sweep.id)[0][0].id
        store.write_records([(tid, back)])
        stored = {s.name: s.values for s in store.spectra(tid, epoch=0)}
    assert set(stored) == {*keys, "jacobian_singular_values"}
    for key, values in stored.items():
        assert_same_bits(values, rec[key])
