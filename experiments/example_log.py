"""A small synthetic rollout log whose answer is known, for trying ``replay-theory diagnose``.

    python -m replay_theory.experiments.example_log rollouts.parquet [--shape default|trl|verl] [--seed 0]

The log is drawn from known policy pairs, like an asynchronous GRPO run:

* a log-linear policy over ``vocab`` tokens in each of ``contexts`` contexts (a token's context is drawn uniformly),
  whose logits move by a Gaussian random walk of ``drift`` per policy version (a random walk makes KL grow linearly
  with age: ``drift.py``);
* a sequence of age a was sampled by version T - a, through a sampler whose logits differ from the learner's by
  Gaussian noise of ``mismatch`` (the vLLM-vs-trainer gap, which gives a KL floor at age 0);
* ``logp_behav`` is the sampler's log-prob of the token, ``logp_current`` the current learner's (version T); prompts
  have ``group`` responses with 0/1 rewards and group-mean-centred advantages (Dr. GRPO).  ``exact_kl_by_age``
  is the true KL(pi_behav || pi_current) per age, what ``diagnose``'s per-age ``kl_k1`` / ``kl_k3`` estimate.

Shapes (``--shape``), all holding the same tokens; the suffix sets the format (.parquet, .csv, .jsonl; pyarrow):

========  ==============================================================================================================
default   one row per token (the default schema): seq_id, position, logp_behav, logp_current, age, advantage, reward.
          Parquet, CSV or JSON lines.
trl       one row per sequence, right-padded lists as TRL's ``GRPOTrainer`` holds them: sampling_per_token_logps,
          per_token_logps, completion_mask, advantages, plus version_gap (TRL has no age column: map it with
          ``--columns age=version_gap``).  Parquet or JSON lines.
verl      what ``replay_theory.integrations.verl``'s hook writes (``--preset verl`` reads it with no ``--columns``):
          verl's DataProto keys rollout_log_probs, old_log_probs, response_mask, per-token advantages, and per row
          step, sample_id, group_id, policy_version(_end), age, age_end, scores, rewards; plus version_gap (= age, for
          the older ``--columns age=version_gap``).  The hook's three step time columns are left out: no timings.
========  ==============================================================================================================
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..checks import require_one_of
from ..diagnose.reader import detect_format, require_pyarrow

SHAPES = ("default", "trl", "verl")


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def example_log(rng: np.random.Generator, *, n_prompts: int = 64, group: int = 8, max_age: int = 7,
                min_len: int = 16, max_len: int = 64, vocab: int = 32, contexts: int = 16, drift: float = 0.12,
                mismatch: float = 0.03) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(columns, truth): the long-layout columns (one entry per token) and the exact per-age KL.

    ``truth["age"]`` (max_age + 1,) and ``truth["kl"]``: KL(pi_behav || pi_current) at each age,
    averaged over the uniformly drawn contexts.
    """
    versions = max_age + 1
    steps = drift * rng.normal(size=(versions, contexts, vocab))  # (versions, C, V)
    steps[0] = rng.normal(size=(contexts, vocab))  # version 0: the starting logits
    learner = _log_softmax(np.cumsum(steps, axis=0))  # (versions, C, V); version max_age is current
    sampler = _log_softmax(learner + mismatch * rng.normal(size=learner.shape))  # (versions, C, V)
    current = learner[-1]  # (C, V)

    n_seq = n_prompts * group
    lengths = rng.integers(min_len, max_len + 1, size=n_seq)  # (n_seq,)
    seq_age = np.repeat(rng.integers(0, versions, size=n_prompts), group)  # a prompt's group shares an age
    reward = rng.binomial(1, 0.5, size=n_seq).astype(np.float64)  # (n_seq,)
    advantage = reward - np.repeat(reward.reshape(n_prompts, group).mean(axis=1), group)  # Dr. GRPO centring

    seq = np.repeat(np.arange(n_seq), lengths)  # (n,)
    position = np.arange(seq.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    age = seq_age[seq]  # (n,)
    ctx = rng.integers(0, contexts, size=seq.size)  # (n,)
    behav_table = sampler[max_age - age, ctx]  # (n, V): the sampler that drew each token
    token = np.argmax(behav_table + rng.gumbel(size=behav_table.shape), axis=1)  # (n,) a draw from pi_behav
    columns = {
        "seq_id": seq, "position": position,
        "logp_behav": behav_table[np.arange(seq.size), token], "logp_current": current[ctx, token],
        "age": age.astype(np.float64), "advantage": advantage[seq], "reward": reward[seq],
    }
    per_version = np.sum(np.exp(sampler) * (sampler - current), axis=-1).mean(axis=1)  # (versions,)
    truth = {"age": np.arange(versions, dtype=np.float64), "kl": per_version[::-1].copy()}
    return columns, truth


def _wide(columns: dict[str, np.ndarray], shape: str, group: int = 8) -> dict[str, list]:
    """One row per sequence, right-padded lists (padding log-prob 0.0, mask 0) as the trainers hold them."""
    seq = columns["seq_id"]
    starts = np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]])
    lengths = np.diff(np.r_[starts, seq.size])
    mask = (np.arange(int(lengths.max()))[None, :] < lengths[:, None]).astype(np.int64)  # (n_seq, longest)

    def pad(values: np.ndarray) -> list[list]:
        out = np.zeros(mask.shape, dtype=values.dtype)
        out[mask.astype(bool)] = values
        return out.tolist()

    names = {"trl": ("sampling_per_token_logps", "per_token_logps", "completion_mask"),
             "verl": ("rollout_log_probs", "old_log_probs", "response_mask")}[shape]
    seq_adv = columns["advantage"][starts]
    age = columns["age"][starts].astype(np.int64)
    if shape == "trl":
        return {names[0]: pad(columns["logp_behav"]), names[1]: pad(columns["logp_current"]),
                names[2]: mask.tolist(), "advantages": seq_adv.tolist(), "version_gap": age.tolist()}
    # the verl hook's layout (integrations/verl.py): one step, at which the current weights are version
    # age.max() (verl trains from version global_steps - 1)
    current = int(age.max())
    group_id = np.arange(age.size) // group  # example_log's prompts: ``group`` consecutive responses
    reward = columns["reward"][starts]
    return {
        "step": [current + 1] * age.size, "sample_id": list(range(age.size)), "group_id": group_id.tolist(),
        "policy_version": (current - age).tolist(), "policy_version_end": (current - age).tolist(),
        "age": age.tolist(), "age_end": age.tolist(), "scores": reward.tolist(), "rewards": reward.tolist(),
        names[0]: pad(columns["logp_behav"]), names[1]: pad(columns["logp_current"]), names[2]: mask.tolist(),
        "advantages": (seq_adv[:, None] * mask).tolist(), "version_gap": age.tolist(),
    }


def write_example(path: str | Path, shape: str = "default", seed: int = 0) -> dict[str, np.ndarray]:
    """Write the example log to ``path`` (format from the suffix); returns the exact per-age KL."""
    require_one_of("shape", shape, SHAPES)
    path = Path(path)
    if path.exists():
        raise ValueError(f"{path} exists; choose a new path")
    fmt = detect_format(path)
    if fmt == "csv" and shape != "default":
        raise ValueError("the trl and verl shapes hold lists: write .parquet or .jsonl, not .csv")
    columns, truth = example_log(np.random.default_rng(seed))
    table = {k: v.tolist() for k, v in columns.items()} if shape == "default" else _wide(columns, shape)
    if fmt == "jsonl":
        with open(path, "w") as fh:
            fh.writelines(json.dumps(dict(zip(table, row))) + "\n" for row in zip(*table.values()))
        return truth
    pa = require_pyarrow()
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    (pa_csv.write_csv if fmt == "csv" else pq.write_table)(pa.table(table), path)
    return truth


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m replay_theory.experiments.example_log",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("path", type=Path, help="Where to write the log (.parquet, .csv or .jsonl).")
    parser.add_argument("--shape", default="default", choices=SHAPES, help="Column names and layout.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        truth = write_example(args.path, args.shape, args.seed)
    except ValueError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    kl = "  ".join(f"{a:g}: {k:.4f}" for a, k in zip(truth["age"], truth["kl"]))
    print(f"wrote {args.path} ({args.shape} shape); exact KL(pi_behav || pi_current) by age: {kl}")


if __name__ == "__main__":
    main()
