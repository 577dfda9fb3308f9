"""Replay buffers for S seeds at once: FIFO, selective FIFO, positive-bias, FreshPER, group replay, ExGRPO, stale-k,
epochs.

The simulator's one stateful part (the validator and trainers use it with S = 1): numpy, seed axis first, randomness
only from an explicit ``rng``.  Conventions (add, then sample; use records; dtypes): ``SlotBuffer``, ``RolloutStore``.

| class                 | paper (docs/REFERENCES.md)                            | section / equation                  |
|-----------------------|--------------------------------------------------------|-------------------------------------|
| ``FifoBuffer``        | experience-replay                                      | Sec. 3 (uniform, with replacement), |
|                       |                                                        | App. B.5 ``random.sample`` (without)|
| ``SelectiveFifoBuffer``| selective replay (groups with a non-zero advantage)   | docs/THEORY.md [E8], issue 40       |
| ``PositiveBiasBuffer``| experience-replay                                      | Sec. 4.3 positive-bias sampling     |
| ``PrioritizedBuffer`` | FreshPER (arXiv:2604.16918)                            | Eqs. (2), (14), (15), Alg. 1, 3.5   |
| ``GroupReplayBuffer`` | RLOO group replay                                      | Sec. 3.2, App. B                    |
| ``ExGRPOBuffer``      | ExGRPO                                                 | Sec. 4, Algs. 1-2                   |
| ``StaleKQueue``       | M2PO                                                   | Sec. 3 stale-k setup                |
| ``EpochSchedule``     | PPO epochs (TRL num_iterations, verl ppo_epochs)       | issue 40, docs/THEORY.md [E1]-[E3]  |

| code name               | paper symbol           | meaning                                                   |
|-------------------------|------------------------|-----------------------------------------------------------|
| ``capacity``            | N                      | rollouts kept (FIFO / positive bias / PER)                |
| ``batch_size``          | B                      | rollouts sampled per update                               |
| R (rollouts per add)    | R                      | rollouts generated per step                               |
| ``staleness``           | t - t_i                | off-policiness of a sampled rollout                       |
| ``use_count``           | replay count           | global diversity (exp.-replay Sec. 2)                     |
| ``time_since_last_use`` | time since last use    | local diversity (exp.-replay Sec. 2)                      |
| ``delta``               | delta                  | positive-bias fraction                                    |
| ``alpha, beta, tau``    | alpha, beta, tau       | FreshPER exponents and age-decay constant                 |
| ``max_age``             | L                      | group replay: eligible ages 1..L                          |
| ``group_size``          | K                      | responses per group                                       |
| ``rho``                 | rho                    | replay proportion (RLOO: per fresh group; ExGRPO: of B)   |
| ``k``                   | s (M2PO)               | stale-k delay, in the units of ``step``                   |
| ``epochs, mini_batches``| e, m                   | passes over a generation, updates per pass (b = R / m)    |
| ``admitted``            | (1 - z) R              | selective FIFO: responses of unequal-reward groups let in |
"""

from .base import ReplayBuffer, RolloutStore, Sample, SlotBuffer
from .exgrpo import ExGRPOBuffer, UniformQuestionBuffer
from .group_replay import GroupReplayBuffer
from .prioritized import PER_BASES, PrioritizedBuffer
from .schedules import EpochSchedule, StaleKQueue
from .uniform import FifoBuffer, PositiveBiasBuffer, SelectiveFifoBuffer

__all__ = [
    "Sample",
    "RolloutStore",
    "ReplayBuffer",
    "SlotBuffer",
    "FifoBuffer",
    "SelectiveFifoBuffer",
    "PositiveBiasBuffer",
    "PrioritizedBuffer",
    "PER_BASES",
    "GroupReplayBuffer",
    "ExGRPOBuffer",
    "UniformQuestionBuffer",
    "StaleKQueue",
    "EpochSchedule",
]
