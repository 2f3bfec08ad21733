"""A transformer's attention-only stack (model `transformer`, mlp_ratio 0) at initialization in
the uniform-attention limit, for `service.theory.predict` (docs/science.md, "Attention at
initialization").

**Assumption** (Noci et al. 2022): every attention matrix is uniform, softmax(QKᵀ/√d_h) =
11ᵀ/T, each token attending equally to every token of its sequence. It is exact when the scores
vanish (W_q or W_k zero), and the limit of a vanishing query/key scale. It is *not* the engine's
infinite-width limit: with the 1/√d_h scaling a head's scores have variance (s·g²)²·q_t·q_u at
any width (q_t the mean square of token t at the attention's input, g the init gain), so the
engine departs from it by an amount set by the query/key scale, not by the width; docs/science.md
measures it.

**State.** At infinite width the units of the stream are i.i.d., so the stream is its per-unit
kernel K over the batch's N = n·T tokens (index a·T + t for sample a, token t): K = lim XXᵀ/d over
the (N, d) stream. Every unit has mean 0 over units (zero-mean weights; torch's uniform biases
are a per-unit constant of variance 1/(3·fan_in), i.e. + v_b·11ᵀ). Then, for the engine's
blocks (workers/models/transformer.py):

    embedding   K₀ = s·g²·K_tok + v_b + (1/d)·(11ᵀ ⊗ I_T)     K_tok = tokens·tokensᵀ/token_dim;
                the last term the positional embedding's expected kernel (N(0, 1/d) entries,
                the same for every sample): O(1/d), gone at infinite width, kept because it is
                what keeps a blank token (a digit's empty row) off zero
    Attn(y)     K_a = c²·(s·g²·𝒜(s·g²·K_y + v_b)𝒜 + v_b),  𝒜 = I_n ⊗ 11ᵀ/T
                (uniform attention replaces each token by its sequence's mean: 𝒜 K 𝒜 holds the
                block means of K; W_v, W_o are fresh, zero-mean and independent of the stream)
    pre         x' = x + c·Attn(N(x)):  K' = K + K_a(N(K))      (no skip: K' = K_a)
    post        x' = N(x + c·Attn(x)):  K' = N(K + K_a(K))      (no skip: N(K_a))

with N per token (layer, layer_scale: D K D, D = diag(1/√(K_tt + ε)) — the unit mean is 0, so
LayerNorm's centring removes nothing at infinite width) or per feature over all N tokens (batch,
batch_scale: Yang et al. 2019's kernel of √N·Pu/√(‖Pu‖² + Nε), service.theory.kernels.bn_gaussian,
exact for a Gaussian u). The stream is Gaussian unit by unit (a sum of independent Gaussians)
except after a post-norm BatchNorm with skips; there the stream is carried as `samples` Monte
Carlo draws of one unit's N-vector (seed `seed`).

**Consequences.** Without skips every sequence collapses to rank one after the first block —
𝒜 makes its tokens equal, and a norm keeps equal tokens equal: token_cosine = 1 and
token_isometry_gap = +∞ exactly, from the structure, as Dong et al. 2021's rank collapse. With
skips (pre-norm, no norm) the sequence-centred part of K is kept exactly while the block-constant
part grows (×(1 + c²g⁴) per block without a norm), so the tokens' cosine tends to 1 geometrically
but never reaches it.

Records: the pooled taps (mean over tokens: isometry_gap/attn, /residual, rms, mean_cosine) and the
stream's token metrics; `grad_norm` is not predicted (the uniform limit says nothing of ∂/∂W_q,
∂/∂W_k, which go through the softmax's derivative).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from service.config import DATASET_IMAGES, TrialConfig, tokens_of
from service.isometry import centred_basis, gap_from_eigenvalues, isometry_gap
from service.theory import kernels as kn
from service.theory.firstlayer import weight_variance_scale

TOKENS_MAX = 2048  # N = n·T: the kernel is N × N
DRAWN_TOKENS_MAX = 512  # post-norm BatchNorm with skips: draws (samples, N)
WORK_MAX = 4e8  # depth·N²: about a second of numpy per 1e8
BATCHNORM_WORK_MAX = 1e11  # depth·N³ of the BatchNorm blocks' eigendecompositions
GRAD_WHY = (
    "the uniform-attention limit says nothing of ∂ℒ/∂W_q and ∂ℒ/∂W_k (they go through the "
    "softmax's derivative); not covered"
)
MLP_WHY = (
    "only attention-only stacks (mlp_ratio 0) are covered: the uniform-attention theory here has "
    "no MLP sublayer"
)


def image_tokens(X: np.ndarray, dataset: str, patch_size: int | None) -> np.ndarray:
    """Flattened inputs (n, d_in) → tokens (n, T, token_dim), in the engine's layout
    (workers/models/transformer.py: image rows, or k × k patches in row-major order)."""
    layout, c, h, w = DATASET_IMAGES[dataset]
    n = X.shape[0]
    img = X.reshape(n, h, w, c).transpose(0, 3, 1, 2) if layout == "hwc" else X.reshape(n, c, h, w)
    if patch_size is None:
        return img.transpose(0, 2, 1, 3).reshape(n, h, c * w)
    k = patch_size
    p = img.reshape(n, c, h // k, k, w // k, k).transpose(0, 2, 4, 1, 3, 5)
    return p.reshape(n, (h // k) * (w // k), c * k * k)


def coverage(c: TrialConfig, n: int) -> str | None:
    """Why the theory cannot serve an attention stack of n samples, or None when it can."""
    if c.mlp_ratio:
        return MLP_WHY
    T = tokens_of(c)[0]
    N = n * T
    if N > TOKENS_MAX:
        return (
            f"the batch's n·T = {n}·{T} = {N} tokens are over the {TOKENS_MAX} the N × N kernel is "
            "kept for here (a smaller batch_size, or patches)"
        )
    if c.depth * N * N > WORK_MAX:
        return f"depth·(n·T)² = {c.depth * N * N:.2g} is over the {WORK_MAX:.0e} computed here"
    if c.norm in ("batch", "batch_scale") and c.depth * N**3 > BATCHNORM_WORK_MAX:
        return (
            f"a BatchNorm over n·T = {N} tokens per block (an N × N eigendecomposition) at depth "
            f"{c.depth}: depth·N³ = {c.depth * N**3:.2g} is over the {BATCHNORM_WORK_MAX:.0e} "
            "computed here"
        )
    drawn = c.norm_position == "post" and c.skip and c.norm in ("batch", "batch_scale")
    if drawn and N > DRAWN_TOKENS_MAX:
        return (
            f"a post-norm BatchNorm stream is carried as Monte Carlo draws of its n·T = {N} "
            f"tokens, at most {DRAWN_TOKENS_MAX} here (a smaller batch_size, or patches)"
        )
    return None


def input_free(c: TrialConfig) -> tuple[str, ...]:
    """The predicted metrics that do not depend on the inputs: without skips every sequence
    collapses to one token after the first block, whatever the tokens were."""
    return () if c.skip else ("token_isometry_gap", "token_cosine")


class _Stack:
    def __init__(self, c: TrialConfig, n: int, samples: int, seed: int) -> None:
        self.c, self.n = c, n
        self.T = tokens_of(c)[0]
        self.samples, self.rng = samples, np.random.default_rng(seed)
        g = c.init_gain if (c.init != "orthogonal" or c.orthogonal_gain) else 1.0
        d = c.width
        self.sg2 = weight_variance_scale(c.init, d, d) * g * g  # W_v, W_o: square
        self.vb = 1.0 / (3.0 * d) if (c.bias and c.bias_init == "torch") else 0.0
        self.mc_used = False

    def mix(self, K: np.ndarray) -> np.ndarray:
        """𝒜 K 𝒜: every (a, b) block of K replaced by its mean."""
        n, T = self.n, self.T
        M = K.reshape(n, T, n, T).mean(axis=(1, 3))
        return np.repeat(np.repeat(M, T, axis=0), T, axis=1)

    def attn(self, Ky: np.ndarray) -> np.ndarray:
        """Kernel of c·Attn(y) from the kernel of its input y."""
        c = self.c.residual_scale
        return c * c * (self.sg2 * self.mix(self.sg2 * Ky + self.vb) + self.vb)

    def norm(self, K: np.ndarray) -> np.ndarray:
        """Kernel after the norm of a Gaussian input of kernel K."""
        norm, eps = self.c.norm, self.c.norm_eps
        if norm == "none":
            return K
        if norm in ("layer", "layer_scale"):
            s = 1.0 / np.sqrt(np.diag(K) + eps)
            return K * np.outer(s, s)
        return kn.bn_gaussian(K, eps, centred=norm == "batch")

    def block(
        self, K: np.ndarray, X: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """One block on the stream of kernel K (X: draws of one unit's N-vector where the stream
        is not Gaussian, else None): (kernel of c·Attn, K', X')."""
        c = self.c
        if c.norm_position == "pre":
            Ka = self.attn(self.norm(K))
            return Ka, (K + Ka if c.skip else Ka), None
        Ka = self.attn(K)
        Kh = K + Ka if c.skip else Ka
        if not (c.skip and c.norm in ("batch", "batch_scale")):
            return Ka, self.norm(Kh), None
        # post-norm BatchNorm with skips: BN's output is not Gaussian, and the next block adds
        # a Gaussian branch to it — carried as draws (the branch is independent of the stream)
        M, centred, eps = self.samples, c.norm == "batch", c.norm_eps
        if X is None:
            Xh = kn.gaussian_draws(Kh, M, self.rng)
            return Ka, self.norm(Kh), kn.bn_samples(Xh, eps, centred)
        self.mc_used = True
        Y = kn.bn_samples(X + kn.gaussian_draws(Ka, M, self.rng), eps, centred)
        return Ka, Y.T @ Y / M, Y


def predict_attention(
    c: TrialConfig, X: np.ndarray | None, n: int, samples: int, seed: int
) -> dict[str, Any]:
    """The uniform-attention prediction of an attention-only stack's epoch-0 record (module
    docstring): {metric: (depth,) array} for the pooled taps attn and residual (gap and range
    gap), rms, mean_cosine, token_isometry_gap, token_cosine; "mc_used" (whether Monte Carlo
    entered) and "input_free" (the metrics that do not depend on the inputs)."""
    T, td = tokens_of(c)
    d = c.width
    if X is None:
        Ktok = np.eye(n * T)
    else:
        tok = image_tokens(X, c.dataset, c.patch_size).reshape(n * T, td)
        Ktok = tok @ tok.T / td
    g = c.init_gain if (c.init != "orthogonal" or c.orthogonal_gain) else 1.0
    vb_in = 1.0 / (3.0 * td) if (c.bias and c.bias_init == "torch") else 0.0
    pos = np.kron(np.ones((n, n)), np.eye(T)) / d
    K = weight_variance_scale(c.init, td, d) * g * g * Ktok + vb_in + pos
    stack = _Stack(c, n, samples, seed)
    X_draws = None
    keys = ("attn", "residual", "token_gap", "token_cos", "rms", "cos")
    out: dict[str, list] = {k: [] for k in keys}
    out["attn_range"], out["residual_range"] = [], []
    forced = n > d
    bias = c.bias and c.bias_init == "torch"
    zero = c.residual_scale == 0 and not c.skip  # every token 0 from block 1 on
    for ell in range(1, c.depth + 1):
        Ka, K, X_draws = stack.block(K, X_draws)
        # 1 in the pooled Gram's null space: a batch-centred attention input stays centred
        # through 𝒜 and W_v, W_o (without biases); a post-norm batch centres the stream
        attn_in_centred = c.norm == "batch" and (c.norm_position == "pre" or ell > 1)
        attn_null = attn_in_centred and not bias
        stream_null = (c.norm_position == "post" and c.norm == "batch") or (
            not c.skip and attn_null
        )
        Pa, P = _pooled(Ka, n, T), _pooled(K, n, T)
        for name, G, null in (("attn", Pa, attn_null), ("residual", P, stream_null)):
            gap, rng_gap = _gaps(G, null, forced)
            out[name].append(gap)
            out[f"{name}_range"].append(rng_gap)
        out["rms"].append(math.sqrt(max(float(np.trace(P)), 0.0) / n))
        out["cos"].append(_mean_cosine(P))
        tg, tc = _token_metrics(K, n, T, collapsed=not c.skip, zero=zero, forced=d < T)
        out["token_gap"].append(tg)
        out["token_cos"].append(tc)
    arr = {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
    return {
        "isometry_gap/attn": arr["attn"],
        "range_isometry_gap/attn": arr["attn_range"],
        "isometry_gap/residual": arr["residual"],
        "range_isometry_gap/residual": arr["residual_range"],
        "rms": arr["rms"],
        "mean_cosine": arr["cos"],
        "token_isometry_gap": arr["token_gap"],
        "token_cosine": arr["token_cos"],
        "mc_used": stack.mc_used,
        "input_free": input_free(c),
    }


def _pooled(K: np.ndarray, n: int, T: int) -> np.ndarray:
    """Kernel of the mean over each sample's tokens (n, n): the block means of K."""
    return K.reshape(n, T, n, T).mean(axis=(1, 3))


def _gaps(G: np.ndarray, ones_null: bool, forced: bool) -> tuple[float, float]:
    if ones_null:
        Q = centred_basis(G.shape[0])
        return math.inf, float(gap_from_eigenvalues(np.linalg.eigvalsh(Q.T @ G @ Q)))
    gap = float(isometry_gap(G))
    return (math.inf if forced else gap), gap


def _mean_cosine(K: np.ndarray) -> float:
    s = np.sqrt(np.diag(K))
    n = K.shape[0]
    if n < 2 or not (s > 0).all():
        return math.nan
    C = K / np.outer(s, s)
    return float((C.sum() - np.trace(C)) / (n * (n - 1)))


def _token_metrics(
    K: np.ndarray, n: int, T: int, *, collapsed: bool, zero: bool, forced: bool
) -> tuple[float, float]:
    """(token_isometry_gap, token_cosine): the per-sample T × T blocks' gap and mean off-diagonal
    cosine, averaged over the samples; +∞ and 1 where the structure collapses the sequence."""
    if T < 2:
        return math.inf, math.nan
    if zero:
        return math.inf, math.nan
    if collapsed:
        return math.inf, 1.0
    idx = np.arange(n)
    B = K.reshape(n, T, n, T)[idx, :, idx, :]  # (n, T, T)
    s = np.sqrt(np.einsum("att->at", B))
    C = B / (s[:, :, None] * s[:, None, :])
    cos = float(((C.sum(axis=(1, 2)) - T) / (T * (T - 1))).mean())
    gap = math.inf if forced else float(np.mean(isometry_gap(B)))
    return gap, cos
