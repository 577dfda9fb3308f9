"""Theory of rollout reuse: importance-weight quantities and optimal buffer design.

The formulas only: ``optimal``'s options, its text, the benchmark's evidence and profile files are advise/'s.

Modules (import the one you need; this package imports nothing heavy itself):

- ``divergences``  chi^2, Renyi, KL, k1/k2/k3, M2, ESS: exact (categorical) and from log-ratios
- ``bounds``       identities and bounds between them, each returning both sides
- ``compute``      compute ratio gamma (Eq. 2) and the mu estimate of App. E
- ``profiles``     gradient-noise profiles sigma^2(s), their buffer average and fits, the memory records
- ``design``       Thm 3.4 bound (also at a finite budget, eta optimised), Thm 3.5 optimum (x*, y*),
                   honest regimes, concrete advice
- ``noise``        calibration estimators: rho (unclamped, bootstrap interval), sigma^2(s) plain and normalised
- ``noise_scale``  the noise-scale rule at a fixed batch (psi = 1) and the estimators of B_noise
- ``forgetting``   psi(x, kappa), the forgetting-aware cost, the whole-design search, the estimators of kappa
- ``freshper``     age-decay helpers (FreshPER)
- ``group_replay`` RLOO whole-group replay budget and weights
- ``exgrpo``       ExGRPO policy shaping and bucket probabilities
- ``symbolic``     sympy derivations (imported only by ``replay-theory derive`` and tests)
"""
