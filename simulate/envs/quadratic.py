"""The noisy quadratic: a testbed whose gradient noise scale B_noise is set exactly, for the replay design rule.

Papers: McCandlish et al. 2018 (arXiv 1812.06162), Eqs. (2.7)-(2.11): S = S_min (1 + B_noise / B), B_noise =
tr Sigma / |G|^2; Zhang et al. 2019 (arXiv 1907.04164), Sec. 2: the noisy quadratic, diagonal H, covariance C = H;
experience-replay (docs/REFERENCES.md), Sec. 3: the synchronous FIFO.  The rule it tests: theory/noise_scale.py.
The start, how ``noise_scale`` sets s^2, the sampler's exact shortcuts and what it measures: docs/SIMULATION.md,
'Noisy quadratic'.

    F(theta) = 1/2 (theta - theta*)^T H (theta - theta*),   J = -F (the "reward", rises to J* = 0)
    H = diag(h),  h_k = condition^(-k / (d - 1)),  k = 0 .. d-1   (log-spaced, L = max h = 1)
    a sample is a noise vector z ~ N(0, Sigma), Sigma = s^2 H, drawn when the sample is generated and FIXED after:
    its gradient at the current theta is  H (theta - theta*) + z,  the same z every time the sample is replayed.

Rows are seeds (every array (S, ...)).  ``noise_scale`` is the median of B_noise over the noise-free path to the
target, in samples.

| code name          | symbol                         | meaning                                                    |
|--------------------|--------------------------------|------------------------------------------------------------|
| ``curvature``      | h (d,)                         | eigenvalues of H (H diagonal)                              |
| ``optimum``        | theta* (d,)                    | minimiser of F                                             |
| ``smoothness``     | L = max h                      | McCandlish's / Thm 3.4's L (= 1)                           |
| ``noise_var``      | diag Sigma = s^2 h (d,)        | per-sample noise variance per coordinate                   |
| ``trace_sigma``    | tr Sigma                       | per-sample noise, summed over coordinates                  |
| ``noise_scale``    | B_noise (median on the path)   | McCandlish Eq. (2.11), B_simple, in samples                |
| ``target_time``    | T                              | gradient-flow time from theta_0 to the target              |
| ``capacity``       | N                              | FIFO capacity (experience-replay Sec. 3)                   |
| ``rollouts``       | R                              | fresh samples per step                                     |
| ``batch``          | B                              | samples drawn per step                                     |
| ``epochs``         | e                              | passes over one generation of R (epoch designs, issue 40)  |
| ``mini_batches``   | m                              | updates per pass, each on b = B = R / m of the generation  |
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from ...checks import require_int, require_number, require_open_interval, require_positive
from ...core.buffers import EpochSchedule, FifoBuffer
from ...core.designs import check_capacity
from ...core.rng import PerSeedGenerator
from ...core.rollouts import RolloutBatch

__all__ = ["QuadraticConfig", "QuadraticEnv", "QuadraticReplay", "QuadraticTrace", "expected_loss",
           "expected_loss_epochs", "standard_normal", "stationary_loss_epochs", "train_to_target"]


@dataclass(frozen=True)
class QuadraticConfig:
    """A noisy-quadratic instance; every random draw of the instance comes from ``instance_seed``."""

    dim: int = 16
    """d: dimension of theta."""
    condition: float = 20.0
    """h_max / h_min: eigenvalues of H log-spaced from 1 down to 1 / condition (NQM-style spread spectrum)."""
    noise_scale: float = 256.0
    """B_noise in samples: the median of the exact tr Sigma / |grad F|^2 over the noise-free path to the target
    (b = noise_scale / B; 256 is b = 1 at B = 256)."""
    instance_seed: int = 0
    """Seed of theta* and of the direction of theta_0 - theta*; shared by all training rows."""
    target_fraction: float = 0.95
    """f: target J0 + f (J* - J0), J* = 0 (the theory test's TARGET_FRACTION)."""

    def __post_init__(self) -> None:
        require_int("dim", self.dim, 1)
        require_positive("condition", self.condition)
        require_number("condition", self.condition, at_least=1)
        require_positive("noise_scale", self.noise_scale)
        require_int("instance_seed", self.instance_seed, 0)
        require_open_interval("target_fraction", self.target_fraction, 0, 1)


def standard_normal(rng, rows: int, n: int) -> np.ndarray:
    """(rows, n) float32 standard normals from ``2 ceil(n / 2)`` uniforms per row of ``rng.random`` (Box-Muller).

    ``rng`` is a ``PerSeedGenerator`` (row i from its own stream, all rows in one batched draw) or an
    ``np.random.Generator``. Box-Muller: r = sqrt(-2 log(1 - u1)), z = (r cos 2 pi u2, r sin 2 pi u2), exact in law;
    the transcendental functions run in float32 (4x cheaper than float64 here; relative error ~1e-7, far below the
    noise), on 1 - u1 formed in float64 so that it stays in (0, 1] (u1 <= 1 - 2^-53: |z| <= 8.6).
    """
    k = (n + 1) // 2
    u = rng.random((rows, 2 * k))  # (rows, 2k): u1 | u2
    radius = np.sqrt(np.float32(-2.0) * np.log((1.0 - u[:, :k]).astype(np.float32)))  # (rows, k)
    angle = (u[:, k:] * (2.0 * np.pi)).astype(np.float32)  # (rows, k)
    out = np.empty((rows, 2 * k), dtype=np.float32)
    np.multiply(radius, np.cos(angle), out=out[:, :k])
    np.multiply(radius, np.sin(angle), out=out[:, k:])
    return out[:, :n]


class QuadraticEnv:
    """F(theta) = 1/2 (theta - theta*)^T H (theta - theta*) with per-sample noise N(0, s^2 H); see the module doc."""

    def __init__(self, config: QuadraticConfig = QuadraticConfig()):
        self.config = config
        d = self.param_dim = int(config.dim)
        exponent = np.arange(d) / (d - 1) if d > 1 else np.zeros(1)
        self.curvature = float(config.condition) ** -exponent  # (d,) h: 1 .. 1/condition
        rng = np.random.default_rng([int(config.instance_seed), 31337])
        self.optimum = rng.standard_normal(d)  # (d,) theta*
        u = rng.standard_normal(d)
        u *= math.sqrt(2.0) / np.linalg.norm(u)  # |u|^2 = 2: F(theta_0) = 1
        self.start_offset = u / np.sqrt(self.curvature)  # (d,) theta_0 - theta*
        self.smoothness = float(self.curvature.max())  # L
        self.j_star = 0.0
        self.j0 = -self._loss_along_flow(0.0)  # -F(theta_0) = -1
        self.target = self.j0 + config.target_fraction * (self.j_star - self.j0)  # theory test's target
        f_target = -self.target
        upper = math.log(-self.j0 / f_target) / (2 * self.curvature.min())  # F(t) <= F0 exp(-2 h_min t)
        self.target_time = float(brentq(lambda t: self._loss_along_flow(t) - f_target, 0.0, upper * (1 + 1e-12),
                                        xtol=1e-13, rtol=1e-15))  # T
        grad_sq_mid = self._grad_sq_along_flow(self.target_time / 2)  # |grad F|^2 at the median of the path
        self.noise_level = float(config.noise_scale) * grad_sq_mid / self.curvature.sum()  # s^2
        self.noise_var = self.noise_level * self.curvature  # (d,) diag Sigma = s^2 h
        self.noise_std = np.sqrt(self.noise_var)  # (d,)
        self.trace_sigma = float(self.noise_var.sum())  # tr Sigma

    # ------------------------------------------------------------------ the noise-free path

    def _loss_along_flow(self, t: float) -> float:
        """F(theta(t)) on the gradient flow: 1/2 sum h delta_0^2 exp(-2 h t)."""
        return float(0.5 * np.sum(self.curvature * self.start_offset**2 * np.exp(-2 * self.curvature * t)))

    def _grad_sq_along_flow(self, t: float) -> float:
        return float(np.sum((self.curvature * self.start_offset) ** 2 * np.exp(-2 * self.curvature * t)))

    def flow_b_noise(self, t: np.ndarray) -> np.ndarray:
        """Exact B_noise on the noise-free gradient flow at times ``t`` (any shape); increasing in t."""
        t = np.asarray(t, dtype=float)
        grad = self.curvature * self.start_offset * np.exp(-np.multiply.outer(t, self.curvature))  # (..., d)
        return self.trace_sigma / np.sum(grad**2, axis=-1)

    # ------------------------------------------------------------------ what the benchmark calls

    def _check(self, params: np.ndarray) -> np.ndarray:
        params = np.asarray(params, dtype=np.float64)
        if params.ndim != 2 or params.shape[1] != self.param_dim:
            raise ValueError(f"params must have shape (rows, {self.param_dim}), got {params.shape}")
        return params

    def init_params(self, rows: int) -> np.ndarray:
        """theta_0 (rows, d), every row the same."""
        rows = int(require_int("rows", rows, 1))
        return np.tile(self.optimum + self.start_offset, (rows, 1))

    def evaluate(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """{"reward": J = -F (rows,), "loss": F (rows,)}, exact."""
        delta = self._check(params) - self.optimum  # (rows, d)
        loss = 0.5 * (delta**2 @ self.curvature)  # (rows,)
        return {"reward": -loss, "loss": loss}

    def exact_grad(self, params: np.ndarray) -> np.ndarray:
        """grad J = -H (theta - theta*) (rows, d): the ascent direction of the reward."""
        return -(self._check(params) - self.optimum) * self.curvature

    def b_noise(self, params: np.ndarray) -> np.ndarray:
        """Exact B_noise = tr Sigma / |grad F(theta)|^2 (rows,); inf at theta* (no signal: said, not clamped)."""
        grad_sq = np.sum(self.exact_grad(params) ** 2, axis=1)
        with np.errstate(divide="ignore"):
            return self.trace_sigma / grad_sq

    def noise(self, rng, shape: tuple[int, ...]) -> np.ndarray:
        """Per-sample noise vectors z ~ N(0, Sigma), shape ``shape + (d,)``; shape[0] is the row axis."""
        shape = tuple(int(v) for v in shape)
        if not shape:
            raise ValueError("shape must have the row axis first, got ()")
        n = math.prod(shape[1:]) * self.param_dim
        xi = standard_normal(rng, shape[0], n).reshape(shape + (self.param_dim,))
        return xi * self.noise_std  # sqrt(diag Sigma) xi, float64

    def sample_grads(self, params: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Per-sample gradients of F, H (theta - theta*) + z: params (rows, d), noise (rows, m, d) -> (rows, m, d)."""
        return -self.exact_grad(params)[:, None, :] + noise


class QuadraticReplay:
    """The stateful sampler: each row's buffer of samples (noise vectors), one gradient per step.

    FIFO (``on_policy=False``): each ``gradient`` call generates R samples, pushes their ids into a
    ``FifoBuffer(rows, N)`` and draws B ids with replacement (``FifoBuffer.select`` on ``rng.random``, what
    ``FifoBuffer.sample`` draws); on-policy: N = R = B, every fresh sample used once. Epochs (e m > 1, N = R,
    B = R / m): core's ``EpochSchedule`` (fixed order) says when a generation of R is due and which b = B of its
    positions each update trains on; the generation's noise (S, R, d) is drawn when it is generated, and each update's
    noise is the mean of its mini-batch's. ``rng``: a ``PerSeedGenerator`` (each row its own stream) or an
    ``np.random.Generator``.
    """

    def __init__(self, env: QuadraticEnv, capacity: int, rollouts: int, batch: int, rows: int, rng, *,
                 on_policy: bool, materialise: bool = False, epochs: int = 1, mini_batches: int = 1):
        self.env, self.rng = env, rng
        self.capacity = int(require_int("capacity N", capacity, 1))
        self.rollouts = int(require_int("rollouts R", rollouts, 1))
        self.batch = int(require_int("batch B", batch, 1))
        self.rows = int(require_int("rows", rows, 1))
        self.epochs = int(require_int("epochs e", epochs, 1))
        self.mini_batches = int(require_int("mini-batches m", mini_batches, 1))
        self.on_policy, self.materialise = bool(on_policy), bool(materialise)
        N, R, B, S = self.capacity, self.rollouts, self.batch, self.rows
        if self.on_policy and not N == R == B:
            raise ValueError(f"on-policy needs capacity N = rollouts R = batch B, got N={N}, R={R}, B={B}")
        check_capacity(N, R, names=("capacity N", "rollouts R"))
        self.generated = 0  # samples generated per row so far: the next id
        self.schedule: EpochSchedule | None = None
        if self.epochs * self.mini_batches > 1:
            if self.on_policy or N != R or B * self.mini_batches != R:
                raise ValueError(f"an epoch design needs N = R and B m = R, not on-policy; got N={N}, R={R}, B={B}, "
                                 f"m={self.mini_batches}")
            self.schedule = EpochSchedule(S, self.epochs, self.mini_batches, shuffle=False)
            self.generation_noise = np.zeros((S, R, env.param_dim), dtype=np.float32)  # xi of the current generation
            zeros_i, zeros_f = np.zeros((S, R), np.int64), np.zeros((S, R))
            self._generation = RolloutBatch(prompt=zeros_i, tokens=np.zeros((S, R, 1), np.int64),
                                            mask=np.ones((S, R, 1), bool), logp_behav=np.zeros((S, R, 1)),
                                            reward=zeros_f, advantage=zeros_f, created=np.zeros((S, R), np.int64),
                                            group=zeros_i)
            self.stores_noise = False
            return
        self.last_ids: np.ndarray | None = None  # (S, B) ids drawn at the last step (FIFO)
        self.buffer: FifoBuffer | None = None
        self.stores_noise = not self.on_policy and (N > R or self.materialise)
        if not self.on_policy:
            self.buffer = FifoBuffer(S, N, 1)
            zeros_i, zeros_f = np.zeros((S, R), np.int64), np.zeros((S, R))
            # the buffer copies a batch into its store, so one set of arrays serves every step
            self._ids, self._created = np.zeros((S, R), np.int64), np.zeros((S, R), np.int64)  # (S, R) each
            self._fresh = RolloutBatch(prompt=zeros_i, tokens=np.zeros((S, R, 1), np.int64),
                                       mask=np.ones((S, R, 1), bool), logp_behav=np.zeros((S, R, 1)), reward=zeros_f,
                                       advantage=zeros_f, created=self._created, group=self._ids)
            self._row_cells = np.arange(S)[:, None] * N  # (S, 1) offsets into (S * N)
        if self.stores_noise:
            # (S, N, d) float32: xi of the sample with id i at slot i mod N, its noise z = sqrt(diag Sigma) xi
            self.noise_ring = np.zeros((S, N, env.param_dim), dtype=np.float32)

    def gradient(self, step: int, params: np.ndarray) -> np.ndarray:
        """The step's ascent direction (rows, d): -(mean over the B samples used of H (theta - theta*) + z)."""
        exact = self.env.exact_grad(params)  # (S, d) = -H (theta - theta*)
        return exact - self._noise_mean(int(step))

    def _noise_mean(self, step: int) -> np.ndarray:
        """Mean noise (S, d) of this step's B samples (generating this step's R)."""
        env, S, R, B, N = self.env, self.rows, self.rollouts, self.batch, self.capacity
        if self.schedule is not None:
            return self._epoch_noise_mean(step)
        first = self.generated
        self.generated += R
        if self.on_policy:
            if self.materialise:
                return env.noise(self.rng, (S, R)).mean(axis=1)  # (S, R, d) -> (S, d)
            return standard_normal(self.rng, S, env.param_dim) * (env.noise_std / math.sqrt(R))  # N(0, Sigma / R)
        self._ids[:] = first + np.arange(R)  # (S, R) this step's sample ids
        self._created.fill(step)
        if self.stores_noise:
            xi = standard_normal(self.rng, S, R * env.param_dim).reshape(S, R, env.param_dim)  # fixed from now on
            self.noise_ring[:, (first + np.arange(R)) % N] = xi
        buffer = self.buffer
        assert buffer is not None  # made in __init__ whenever not on-policy
        buffer.add(self._fresh, step)
        # uses are never recorded (select, not sample): the evicted use counts the buffer logs for diagnostics are
        # all 0 and would grow by S R integers a step (0.65 GB over 2000 steps at S = 160, R = 256)
        buffer._evicted.clear()
        u = self.rng.random(buffer.uniform_shape(B))  # what FifoBuffer.sample draws
        slots = buffer.select(u, B)  # (S, B): Sec. 3, uniform with replacement over what is stored
        self.last_ids = np.take(buffer.store.group, (slots + self._row_cells).ravel()).reshape(S, B)
        if self.stores_noise and B < N:  # gather the B drawn noise vectors: S B d work instead of S N d
            drawn = self.noise_ring[np.arange(S)[:, None], self.last_ids % N]  # (S, B, d)
            return drawn.sum(axis=1) * (env.noise_std / B)  # sum_i c_i z_i / B
        cells = (self.last_ids % N + self._row_cells).ravel()  # (S * B,) into the (S * N) noise ring
        counts = np.bincount(cells, minlength=S * N).reshape(S, N)  # (S, N) c_i: draws of each stored sample
        if self.stores_noise:
            summed = (counts.astype(np.float32)[:, None, :] @ self.noise_ring)[:, 0]  # (S, 1, N) @ (S, N, d)
            return summed * (env.noise_std / B)  # sum_i c_i z_i / B
        scale = np.sqrt(np.einsum("sn,sn->s", counts, counts))[:, None] / B  # (S, 1) sqrt(sum_i c_i^2) / B
        return standard_normal(self.rng, S, env.param_dim) * (env.noise_std * scale)  # N(0, Sigma sum c_i^2 / B^2)

    def _epoch_noise_mean(self, step: int) -> np.ndarray:
        """Mean noise (S, d) of this update's mini-batch of the current generation (generating one when due)."""
        schedule, env, S, R = self.schedule, self.env, self.rows, self.rollouts
        assert schedule is not None
        if schedule.due():
            self.generated += R
            self.generation_noise[:] = standard_normal(self.rng, S, R * env.param_dim).reshape(S, R, env.param_dim)
            self._generation.created.fill(step)
            schedule.add(self._generation, step)
        index = schedule.sample(self.batch, step, self.rng).index  # (S, b) positions of the generation
        drawn = np.take_along_axis(self.generation_noise, index[:, :, None], axis=1)  # (S, b, d)
        return drawn.mean(axis=1, dtype=np.float64) * env.noise_std


@dataclass
class QuadraticTrace:
    first_passage: np.ndarray  # (lrs, seeds) 1-based step at which each row first reached the target
    censored: np.ndarray  # (lrs, seeds) bool: never reached within ``steps``
    steps: int  # steps run


def train_to_target(env: QuadraticEnv, lrs, capacity: int, rollouts: int, batch: int, seeds: int, max_steps: int,
                    *, on_policy: bool, seed: int = 0, rng=None, materialise: bool = False,
                    stop_factor: float = 1.25) -> QuadraticTrace:
    """SGD theta <- theta + eta g (g from ``QuadraticReplay``), every (lr, seed) row at once, lr-major rows as
    ``experiments.theory_bench.measure``, with its stopping rule: stop once some lr has every seed past
    ``env.target`` and the step count exceeds ``stop_factor`` x that lr's best mean first passage (so the step size is
    decided), or when every row has passed, or at ``max_steps``.

    ``rng`` defaults to ``PerSeedGenerator(seed, rows)``, what ``train`` uses.
    """
    lrs = np.asarray(lrs, dtype=float).ravel()
    require_positive("lr", lrs)
    require_int("seeds", seeds, 1)
    require_int("max_steps", max_steps, 1)
    nl, rows = lrs.size, lrs.size * int(seeds)
    rng = PerSeedGenerator(seed, rows) if rng is None else rng
    sampler = QuadraticReplay(env, capacity, rollouts, batch, rows, rng, on_policy=on_policy,
                              materialise=materialise)
    lr = np.repeat(lrs, seeds)[:, None]  # (rows, 1), lr-major
    params = env.init_params(rows)
    passage = np.full(rows, max_steps + 1, dtype=np.int64)
    step = 0
    for step in range(int(max_steps)):
        params = params + lr * sampler.gradient(step, params)  # ascent on J = descent on F
        newly = (passage > max_steps) & (env.evaluate(params)["reward"] >= env.target)
        passage[newly] = step + 1
        complete = (passage <= max_steps).reshape(nl, -1).all(axis=1)  # (lrs,)
        if complete.any():
            best = passage.reshape(nl, -1)[complete].mean(axis=1).min()
            if complete.all() or step + 1 >= stop_factor * best:
                break
    steps = step + 1
    censored = passage > steps
    return QuadraticTrace(np.where(censored, steps + 1, passage).reshape(nl, -1), censored.reshape(nl, -1), steps)


def _all_reached(loss: np.ndarray, reached: np.ndarray, stop_below: float | None) -> bool:
    """Mark the step sizes whose E F ``loss`` (L,) is at or below ``stop_below`` in ``reached`` (L,), in place; True
    once every one has been (an exact curve may then stop)."""
    if stop_below is None:
        return False
    reached |= loss <= stop_below
    return bool(reached.all())


def expected_loss(env: QuadraticEnv, lrs, capacity: int, rollouts: int, batch: int, steps: int, *,
                  on_policy: bool, stop_below: float | None = None, epochs: int = 1,
                  mini_batches: int = 1) -> np.ndarray:
    """E F(theta_t) (lrs, steps + 1) of SGD on ``env`` for one design, exactly (no sampling), buffer start-up included.

    Per eigendirection (H and Sigma are diagonal, so directions decouple) with a = 1 - eta h, e_t = theta_t - theta*
    and the step's noise mean (1/B) sum_j z_{I_j} over B draws with replacement from the n_t = R min(t + 1, x) samples
    the FIFO holds (x = N / R):

        M_{t+1} = a^2 M_t - 2 a eta (R / n_t) sum_slots u_t sigma^2 + eta^2 sigma^2 (1/B + (1 - 1/B) / n_t)
        u_{t+1} = a u_t - eta / n_t   for every stored generation, 0 for the one generated at step t + 1

    where M_t = E e_t^2 and u_t = E[e_t z] / sigma^2 of a sample of one stored generation (all of its R samples share
    it: they were drawn, and so remembered, alike). On-policy without replacement: M_{t+1} = a^2 M_t + eta^2
    sigma^2 / B. E F_t = sum_i h_i M_t,i / 2. Its stationary point is ``derive forgetting-variance``'s V_eff.
    ``stop_below``: stop once every step size's E F has been at or below it (the returned curve is then shorter).
    An epoch design (``epochs`` x ``mini_batches`` > 1): ``expected_loss_epochs``.
    """
    if int(epochs) * int(mini_batches) > 1:
        if on_policy or capacity != rollouts or batch * mini_batches != rollouts:
            raise ValueError(f"an epoch design needs N = R and B m = R, not on-policy; got N={capacity}, "
                             f"R={rollouts}, B={batch}, m={mini_batches}")
        return expected_loss_epochs(env, lrs, rollouts, epochs, mini_batches, steps, stop_below=stop_below)
    lrs = np.asarray(lrs, dtype=float).ravel()
    require_positive("lr", lrs)
    N, R, B = (int(require_int(n, v, 1)) for n, v in (("capacity N", capacity), ("rollouts R", rollouts),
                                                     ("batch B", batch)))
    steps = int(require_int("steps", steps, 0))
    if on_policy and not N == R == B:
        raise ValueError(f"on-policy needs capacity N = rollouts R = batch B, got N={N}, R={R}, B={B}")
    if N % R:
        raise ValueError(f"capacity N must be a multiple of rollouts R, got N={N}, R={R}")
    x = N // R
    h, var = env.curvature, env.noise_var  # (d,) each
    eta = lrs[:, None]  # (L, 1)
    a = 1.0 - eta * h  # (L, d)
    m = np.tile(env.start_offset**2, (lrs.size, 1))  # (L, d) M_0 = e_0^2
    u = np.zeros((lrs.size, h.size, x))  # (L, d, x) per generation slot (slot = step mod x)
    out = np.empty((lrs.size, steps + 1))
    out[:, 0] = 0.5 * m @ h
    reached = np.zeros(lrs.size, bool)
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging step: inf / nan, never below the target
        for t in range(steps):
            if on_policy:
                m = a * a * m + eta**2 * var / B
            else:
                u[:, :, t % x] = 0.0  # this step's generation joins (evicting the oldest once full)
                n = R * min(t + 1, x)
                m = a * a * m - 2 * a * eta * (R / n) * u.sum(axis=2) * var + eta**2 * var * (1 / B + (1 - 1 / B) / n)
                u = a[:, :, None] * u - eta[:, :, None] / n
                u[:, :, t + 1:] = 0.0  # during start-up the slots after t hold no generation yet
            out[:, t + 1] = 0.5 * m @ h
            if _all_reached(out[:, t + 1], reached, stop_below):
                return out[:, : t + 2]
    return out


def _epoch_update(a: np.ndarray, eta: np.ndarray, var_b: np.ndarray, m: np.ndarray, u: np.ndarray,
                  k: int) -> tuple[np.ndarray, np.ndarray]:
    """One update on mini-batch k of the generation: (M', u') from (M, u); u (L, d, m) in units of sigma^2 / b."""
    m = a * a * m - 2 * a * eta * u[:, :, k] * var_b + eta**2 * var_b
    u = a[:, :, None] * u
    u[:, :, k] -= eta
    return m, u


def expected_loss_epochs(env: QuadraticEnv, lrs, rollouts: int, epochs: int, mini_batches: int, steps: int, *,
                         stop_below: float | None = None) -> np.ndarray:
    """E F(theta_t) (lrs, steps + 1) of SGD under the fixed-order epoch schedule (``core.buffers.EpochSchedule``),
    exactly: e passes over the same m mini-batches of b = R / m of one generation, then the next generation.

    Per eigendirection with a = 1 - eta h: the generation's m mini-batch noise means zeta_k are independent with
    variance sigma^2 / b; u_k = E[e zeta_k] / (sigma^2 / b). Update j of a generation trains on k = j mod m:

        M' = a^2 M - 2 a eta u_k sigma^2 / b + eta^2 sigma^2 / b,    u_k' <- a u_k' - eta [k' = k]  (every k')

    and every u resets to 0 when a generation starts (every e m updates). e = m = 1 is on-policy's recursion.
    """
    lrs = np.asarray(lrs, dtype=float).ravel()
    require_positive("lr", lrs)
    R, e, mb = (int(require_int(n, v, 1)) for n, v in (("rollouts R", rollouts), ("epochs e", epochs),
                                                      ("mini-batches m", mini_batches)))
    if R % mb:
        raise ValueError(f"rollouts R must be whole mini-batches, got R={R}, m={mb}")
    steps = int(require_int("steps", steps, 0))
    h, var_b = env.curvature, env.noise_var / (R // mb)  # (d,) each: sigma^2 / b
    eta = lrs[:, None]  # (L, 1)
    a = 1.0 - eta * h  # (L, d)
    m = np.tile(env.start_offset**2, (lrs.size, 1))  # (L, d) M_0 = e_0^2
    u = np.zeros((lrs.size, h.size, mb))
    out = np.empty((lrs.size, steps + 1))
    out[:, 0] = 0.5 * m @ h
    reached = np.zeros(lrs.size, bool)
    with np.errstate(over="ignore", invalid="ignore"):  # a diverging step: inf / nan, never below the target
        for t in range(steps):
            if t % (e * mb) == 0:
                u[:] = 0.0  # a new generation: its noise is independent of everything so far
            m, u = _epoch_update(a, eta, var_b, m, u, t % mb)
            out[:, t + 1] = 0.5 * m @ h
            if _all_reached(out[:, t + 1], reached, stop_below):
                return out[:, : t + 2]
    return out


def stationary_loss_epochs(env: QuadraticEnv, lrs, rollouts: int, epochs: int, mini_batches: int) -> np.ndarray:
    """The epoch schedule's stationary E F (lrs,), averaged over the e m updates of a generation: the recursion is
    periodic, affine in M with u reset each generation, so at a generation's start M* = c / (1 - a^(2 e m)) with c the
    M one generation reaches from M = 0; inf once a step diverges (|a| >= 1)."""
    lrs = np.asarray(lrs, dtype=float).ravel()
    e, mb = int(epochs), int(mini_batches)
    h, var_b = env.curvature, env.noise_var / (int(rollouts) // mb)
    eta = lrs[:, None]
    a = 1.0 - eta * h  # (L, d)
    out = np.full(lrs.size, np.inf)
    ok = (np.abs(a) < 1).all(axis=1)
    if not ok.any():
        return out
    a, eta = a[ok], eta[ok]

    def generation(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u, total = np.zeros(m.shape + (mb,)), np.zeros(m.shape[0])
        for j in range(e * mb):
            m, u = _epoch_update(a, eta, var_b, m, u, j % mb)
            total += 0.5 * m @ h
        return m, total / (e * mb)

    c, _ = generation(np.zeros_like(a))
    _, mean = generation(c / (1 - a ** (2 * e * mb)))
    out[ok] = mean
    return out
