"""The diagnose-log hook for verl's v1 trainer (``trainer.use_v1=True``, verl 0.9.1's default) writes what
``diagnose --preset verl`` reads, with every number equal to a hand computation from the arrays put in.

What ran and what was only read.  Ran, verl's real code on CPU: ``PPOTrainerSync`` built by verl's own
``PPOTrainer.__init__`` from verl's generated default config (``_generated_ppo_trainer.yaml``), registered by
``register_v1_trainers`` through verl's ``register_trainer``/``get_trainer_cls``; verl's ``_compute_old_log_prob``
(its ``response_from_nested`` alignment), ``_compute_advantage`` (its GRPO estimator, through
``compute_advantage_for_multi_trajectories``), ``_update_actor`` and ``_compute_metrics`` (its own staleness
metrics), each timed by verl's ``marked_timer``; a real TransferQueue (``transferqueue`` 0.1.11, SimpleStorage on a
local Ray) holding the rows as verl's agent loop puts them (``list_of_dict_to_tensordict``, the tags of
trainer/ppo/v1/agent_loop_tq.py:182-227) and cleared with ``tq.kv_clear`` as ``fit`` does (trainer_base.py:511).
Stubbed: the actor worker group (``compute_log_prob`` writes the known log-probs to TransferQueue in the layout of
verl's workers, ``update_actor`` returns metrics: no model, no GPU) and ``resource_pool_manager``.  Only read, not
run: ``PPOTrainer.fit`` (its loop is mirrored step by step below, trainer_base.py:465-511), the replay buffer's
``sample``, the rollout servers, and the Ray ``worker_process_setup_hook`` route to ``register_v1_trainers``.

Needs verl 0.9.1 and its ``verl-core`` extra (``transferqueue``) plus ray; skipped where they do not import.
"""

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")
ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")
v1 = pytest.importorskip("verl.trainer.ppo.v1")

from omegaconf import OmegaConf, open_dict  # noqa: E402 (after the importorskips)
from tensordict import TensorDict  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.utils.debug import marked_timer  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from replay_theory.diagnose import DiagnoseConfig, diagnose  # noqa: E402
from replay_theory.integrations.export import VERL_LOG_COLUMNS  # noqa: E402
from replay_theory.integrations.verl import (  # noqa: E402
    BALANCE_REFUSAL,
    VerlV1DiagnoseLogMixin,
    register_v1_trainers,
)

ROWS, G, PROMPT = 8, 4, 3  # responses per step, GRPO group size (rollout.n), prompt length
# verl's global_steps and the weights versions each row's rollout started / ended under (tags min/max_global_steps)
STEPS = (
    dict(step=3, start=[2, 2, 2, 2, 1, 1, 1, 1], end=[2, 2, 2, 2, 1, 2, 1, 1]),
    dict(step=4, start=[3, 3, 3, 3, 1, 1, 2, 2], end=[3, 3, 3, 3, 2, 1, 3, 2]),
)


@pytest.fixture(scope="module")
def transfer_queue():
    """A local Ray with TransferQueue's controller and one SimpleStorage unit, as verl's TaskRunnerV1 starts it."""
    if ray.is_initialized():
        pytest.skip("a Ray instance is already running in this process")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
    finally:
        tq.close()
        ray.shutdown()


def _config(path, **algorithm):
    """verl 0.9.1's generated default config (use_v1=True), GRPO with rollout log-probs, the log path set."""
    import verl

    cfg = OmegaConf.load(os.path.join(os.path.dirname(verl.__file__), "trainer/config/_generated_ppo_trainer.yaml"))
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "sync"  # the default this hook serves
    cfg.algorithm.adv_estimator = "grpo"
    cfg.actor_rollout_ref.rollout.n = G
    cfg.actor_rollout_ref.rollout.calculate_log_probs = True
    cfg.trainer.critic_warmup = 0
    with open_dict(cfg):
        cfg.trainer.diagnose_log = str(path)
        for key, value in algorithm.items():
            OmegaConf.update(cfg, f"algorithm.{key}", value, force_add=True)
    return cfg


def _rows(seed: int, spec: dict) -> list[dict]:
    """One step's responses: variable lengths, one tool-result token (mask 0 mid-response), float32 log-probs."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(ROWS):
        n = int(rng.integers(2, 7))
        mask = np.ones(n, dtype=np.int64)
        if i == 0:
            mask[1] = 0  # a multi-turn tool result: verl's response_mask is 0 there
        rollout = (-rng.exponential(1.0, size=n)).astype(np.float32)
        old = np.minimum(rollout + 0.3 * rng.normal(size=n), -1e-3).astype(np.float32)
        rows.append(dict(uid=f"p{spec['step']}g{i // G}", session=i % G, n=n, mask=mask, rollout=rollout, old=old,
                         score=float(rng.binomial(1, 0.5)), start=spec["start"][i], end=spec["end"][i]))
    return rows


def _put_rows(rows: list[dict]) -> KVBatchMeta:
    """Put the rows into TransferQueue as verl's agent loop does (agent_loop_tq.py:182-227)."""
    keys, fields, tags = [], [], []
    for r in rows:
        rm_scores = torch.zeros(r["n"], dtype=torch.float32)
        rm_scores[-1] = r["score"]  # AgentLoopOutput.as_dict: the outcome on the last response token
        keys.append(f"{r['uid']}_{r['session']}_0")
        fields.append({"prompts": torch.zeros(PROMPT, dtype=torch.int64),
                       "responses": torch.arange(r["n"], dtype=torch.int64),
                       "response_mask": torch.tensor(r["mask"]), "rollout_log_probs": torch.tensor(r["rollout"]),
                       "rm_scores": rm_scores, "uid": r["uid"], "num_turns": 2})
        tags.append({"status": "success", "prompt_len": PROMPT, "response_len": r["n"], "seq_len": PROMPT + r["n"],
                     "global_steps": r["start"], "min_global_steps": r["start"], "max_global_steps": r["end"]})
    return tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)


class _ActorWorkers:
    """Stands in for verl's actor worker group: no model; it writes the known log-probs where verl's workers do."""

    def __init__(self, old: dict[str, np.ndarray]) -> None:
        self.old = old

    def compute_log_prob(self, batch: KVBatchMeta) -> KVBatchMeta:
        # verl's workers return (prompt + response) log-probs shifted left by one token; verl's
        # response_from_nested (workers/utils/padding.py:194) cuts the response out of them
        log_probs, entropy = [], []
        for key in batch.keys:
            full = torch.zeros(PROMPT + self.old[key].size, dtype=torch.float32)
            full[PROMPT - 1:PROMPT - 1 + self.old[key].size] = torch.tensor(self.old[key])
            log_probs.append(full)
            entropy.append(torch.full_like(full, 0.5))
        fields = TensorDict({"log_probs": torch.nested.as_nested_tensor(log_probs, layout=torch.jagged),
                             "entropy": torch.nested.as_nested_tensor(entropy, layout=torch.jagged)},
                            batch_size=[len(batch.keys)])
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)

    def update_actor(self, batch: KVBatchMeta) -> dict:
        return {"metrics": {"mfu": [0.0], "pg_loss": [0.5]}}


class _NoiseActorWorkers(_ActorWorkers):
    """As _ActorWorkers, and the actor's metrics carry what VerlGradNoiseMixin adds on verl's engine: one value per
    mini-batch of each noise/* metric (the step's list, as verl's train_mini_batch collects them)."""

    def __init__(self, old: dict[str, np.ndarray], noise: dict[str, list[float]]) -> None:
        super().__init__(old)
        self.noise = noise

    def update_actor(self, batch: KVBatchMeta) -> dict:
        metrics = super().update_actor(batch)["metrics"]
        return {"metrics": {**metrics, **{f"noise/{k}": list(v) for k, v in self.noise.items()}}}


def _train_step(trainer, rows: list[dict], step: int, noise: dict | None = None) -> dict:
    """verl's PPOTrainer.fit for one step (trainer_base.py:465-511) with _step_once's stages (L562-612)."""
    trainer.global_steps = step
    old = {f"{r['uid']}_{r['session']}_0": r["old"] for r in rows}
    trainer.actor_rollout_wg = _ActorWorkers(old) if noise is None else _NoiseActorWorkers(old, noise)
    metrics, timing_raw = {}, {}
    with marked_timer("step", timing_raw):
        with marked_timer("gen", timing_raw):
            batch = _put_rows(rows)  # the replay buffer's sample returns these keys and tags
        with marked_timer("old_log_prob", timing_raw):
            batch = trainer._compute_old_log_prob(batch, metrics=metrics)
        with marked_timer("adv", timing_raw):
            batch = trainer._compute_advantage(batch, metrics=metrics)
        with marked_timer("update_actor", timing_raw):
            batch = trainer._update_actor(batch, metrics=metrics)
    trainer._compute_metrics(batch, metrics, timing_raw, global_steps=step, epoch=0)  # L500: the hook's capture
    tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)  # L511: the data is gone after this
    return dict(metrics=metrics, timing=dict(timing_raw))


def test_v1_sync_trainer_step_writes_what_preset_verl_reads(tmp_path, transfer_queue, cli):
    path = tmp_path / "v1.parquet"
    trainer_cls = register_v1_trainers()["sync_diagnose"]
    assert v1.get_trainer_cls("sync_diagnose") is trainer_cls and issubclass(trainer_cls, v1.PPOTrainerSync)
    assert register_v1_trainers()["sync_diagnose"] is trainer_cls  # idempotent
    trainer = trainer_cls(config=_config(path))  # verl's own PPOTrainer.__init__
    trainer.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 1)

    steps = []
    for seed, spec in enumerate(STEPS):
        rows = _rows(seed, spec)
        steps.append((spec, rows, _train_step(trainer, rows, spec["step"])))
    trainer.diagnose_log.close()

    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert table.column_names == list(VERL_LOG_COLUMNS)
    col = {name: table.column(name).to_pylist() for name in table.column_names}
    all_rows = [r for _, rows, _ in steps for r in rows]
    assert col["step"] == [spec["step"] for spec, _, _ in steps for _ in range(ROWS)]
    assert col["group_id"] == [i // G for i in range(len(all_rows))]
    assert col["policy_version"] == [r["start"] for r in all_rows]
    assert col["policy_version_end"] == [r["end"] for r in all_rows]
    # age = (global_steps - 1) - min_global_steps, verl's trajectory_staleness_worst (trainer_base.py:1980)
    ages = [spec["step"] - 1 - r["start"] for spec, rows, _ in steps for r in rows]
    assert col["age"] == ages
    assert col["age_end"] == [spec["step"] - 1 - r["end"] for spec, rows, _ in steps for r in rows]
    for spec, rows, out in steps:  # the same numbers as verl's own staleness metrics of the step
        m = out["metrics"]
        assert m["training/off_policy/trajectory_staleness_worst/mean"] == pytest.approx(
            np.mean([spec["step"] - 1 - r["start"] for r in rows]), rel=1e-12)
        assert m["training/off_policy/trajectory_staleness/mean"] == pytest.approx(
            np.mean([spec["step"] - 1 - r["end"] for r in rows]), rel=1e-12)
    assert col["step_generation_seconds"] == [out["timing"]["gen"] for *_, out in steps for _ in range(ROWS)]
    assert col["step_update_seconds"] == [out["timing"]["update_actor"] for *_, out in steps for _ in range(ROWS)]
    assert col["scores"] == col["rewards"] == [r["score"] for r in all_rows]

    # per-token lists: right-padded to the step's longest response, exactly the values put in
    for i, r in enumerate(all_rows):
        n = r["n"]
        assert col["response_mask"][i][:n] == r["mask"].tolist() and not any(col["response_mask"][i][n:])
        assert col["rollout_log_probs"][i][:n] == r["rollout"].astype(np.float64).tolist()
        assert col["old_log_probs"][i][:n] == r["old"].astype(np.float64).tolist()  # through response_from_nested
    # GRPO advantages by hand: (score - group mean) / (group std (n - 1) + 1e-6) on every response token
    for spec_rows in (rows for _, rows, _ in steps):
        scores = np.array([r["score"] for r in spec_rows]).reshape(-1, G)
        adv = (scores - scores.mean(axis=1, keepdims=True)) / (scores.std(axis=1, ddof=1, keepdims=True) + 1e-6)
        for r, a in zip(spec_rows, adv.reshape(-1)):
            got = col["advantages"][all_rows.index(r)][:r["n"]]
            assert got == pytest.approx([a * m for m in r["mask"]], abs=1e-6)

    # the ratio statistics by hand: log r = old_log_probs - rollout_log_probs over response_mask
    lr = np.concatenate([(r["old"].astype(np.float64) - r["rollout"].astype(np.float64))[r["mask"] == 1]
                         for r in all_rows])
    token_age = np.concatenate([np.full(int(r["mask"].sum()), a) for r, a in zip(all_rows, ages)])
    w = np.exp(lr)
    hand = dict(n_tokens=lr.size, ess_frac=w.sum() ** 2 / (lr.size * (w * w).sum()), kl_k1=float(np.mean(-lr)),
                kl_k3=float(np.mean(w - 1 - lr)), ratio_min=math.exp(lr.min()), ratio_max=math.exp(lr.max()))
    report = diagnose(DiagnoseConfig(path=str(path), preset="verl"))
    assert report["n_tokens"] == hand["n_tokens"] and report["n_sequences"] == len(all_rows)
    for key in ("ess_frac", "kl_k1", "kl_k3", "ratio_min", "ratio_max"):
        assert report[key] == pytest.approx(hand[key], rel=1e-12), key
    assert [b["age"] for b in report["by_age"]] == sorted(set(ages)) == [0, 1, 2]
    for bucket in report["by_age"]:
        sub = np.exp(lr[token_age == bucket["age"]])
        assert bucket["n_tokens"] == sub.size
        assert bucket["ess_frac"] == pytest.approx(sub.sum() ** 2 / (sub.size * (sub * sub).sum()), rel=1e-12)

    code, out, err = cli("diagnose", str(path), "--preset", "verl", "--json", "--no-progress")
    assert code == 0, err
    cli_report = json.loads(out)
    for key in ("n_tokens", "ess_frac", "kl_k1", "kl_k3"):
        assert cli_report[key] == report[key], key
    print("v1 hook: hand", {k: hand[k] for k in ("n_tokens", "ess_frac", "kl_k1", "kl_k3")},
          "diagnose", {k: cli_report[k] for k in ("n_tokens", "ess_frac", "kl_k1", "kl_k3")},
          "by_age", [(b["age"], b["n_tokens"], b["ess_frac"]) for b in report["by_age"]])


@pytest.mark.parametrize("algorithm, message", [
    ({"rollout_correction.bypass_mode": True},
     "verl algorithm.rollout_correction.bypass_mode=True copies rollout_log_probs into old_log_probs (every ratio "
     "is 1): the diagnose log needs a run without bypass mode"),
    ("no rollout log-probs",
     "verl batch has no rollout_log_probs: set actor_rollout_ref.rollout.calculate_log_probs=True so the rollout "
     "returns its log-probs (the behaviour side of the ratio)"),
])
def test_v1_run_that_cannot_give_the_ratio_is_refused_when_the_trainer_is_made(tmp_path, algorithm, message):
    path = tmp_path / "refused.parquet"
    if isinstance(algorithm, dict):
        cfg = _config(path, **algorithm)
    else:
        cfg = _config(path)
        cfg.actor_rollout_ref.rollout.calculate_log_probs = False
    with pytest.raises(ValueError) as info:
        register_v1_trainers()["sync_diagnose"](config=cfg)
    assert str(info.value) == message
    assert not path.exists()


def test_v1_noise_log_with_verls_default_balance_batch_is_refused_when_the_trainer_is_made(tmp_path):
    # verl's v1 step balances every batch (trainer_base.py:582); its default config says so (balance_batch: true)
    cfg = _config(tmp_path / "v1.parquet")
    assert cfg.trainer.balance_batch is True
    with open_dict(cfg):
        cfg.trainer.noise_log = str(tmp_path / "noise_scale.jsonl")
    with pytest.raises(ValueError) as info:
        register_v1_trainers()["sync_diagnose"](config=cfg)
    assert str(info.value) == BALANCE_REFUSAL


def test_v1_mixin_closes_the_log_when_fit_returns_or_raises(tmp_path):
    """The mixin's fit wraps verl's (not run here: it needs the rollout servers)."""
    class _Base:
        def __init__(self, config):
            self.config = config

        def fit(self, manager):
            if manager == "boom":
                raise RuntimeError("boom")
            return manager

    class Logged(VerlV1DiagnoseLogMixin, _Base):
        pass

    cfg = OmegaConf.create({"trainer": {"diagnose_log": str(tmp_path / "a.parquet")},
                            "actor_rollout_ref": {"rollout": {"calculate_log_probs": True}}, "algorithm": {}})
    trainer = Logged(cfg)
    assert trainer.fit("done") == "done" and trainer.diagnose_log.closed
    failing = Logged(cfg, diagnose_log=tmp_path / "b.parquet")
    with pytest.raises(RuntimeError, match="boom"):
        failing.fit("boom")
    assert failing.diagnose_log.closed and not (tmp_path / "b.parquet").exists()  # nothing was logged


# two mini-batches a step (values the engine hook would report); verl's reduce_metrics averages them: step 3 gives
# small 10, big 6; step 4 small 8, big 5; B_small 4, B_big 8 (McCandlish App. A.1, over the step means 9 and 5.5):
# |G|^2 = (8 * 5.5 - 4 * 9) / (8 - 4) = 2, tr Sigma = (9 - 5.5) / (1/4 - 1/8) = 28, B_noise = 14
NOISE = {3: {"grad_sq_small": [9.0, 11.0], "grad_sq_big": [5.0, 7.0], "batch_small": [4.0, 4.0],
             "batch_big": [8.0, 8.0]},
         4: {"grad_sq_small": [8.0, 8.0], "grad_sq_big": [4.0, 6.0], "batch_small": [4.0, 4.0],
             "batch_big": [8.0, 8.0]}}


def test_v1_noise_log_gives_b_noise_by_hand_through_calibrate(tmp_path, transfer_queue, cli):
    # verl's own step metrics (reduce_metrics over the mini-batches, the actor/ prefix) carry the engine's two-batch
    # norms to the driver; the mixin writes one line a step; calibrate --preset verl --grad-norms reads it
    path, noise = tmp_path / "v1.parquet", tmp_path / "noise_scale.jsonl"
    cfg = _config(path)
    with open_dict(cfg):
        cfg.trainer.noise_log = str(noise)
        cfg.trainer.balance_batch = False  # the noise log refuses verl's default (it splits groups between halves)
    trainer = register_v1_trainers()["sync_diagnose"](config=cfg)
    trainer.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 1)
    for seed, spec in enumerate(STEPS):
        out = _train_step(trainer, _rows(seed, spec), spec["step"], NOISE[spec["step"]])
        assert out["metrics"]["actor/noise/grad_sq_small"] == np.mean(NOISE[spec["step"]]["grad_sq_small"])
    trainer.diagnose_log.close()
    lines = [json.loads(line) for line in noise.read_text().splitlines()]
    assert lines == [{"step": 3, "grad_sq_small": 10.0, "grad_sq_big": 6.0, "batch_small": 4.0, "batch_big": 8.0,
                      "unit_size": 1},
                     {"step": 4, "grad_sq_small": 8.0, "grad_sq_big": 5.0, "batch_small": 4.0, "batch_big": 8.0,
                      "unit_size": 1}]
    profile = tmp_path / "profile.json"
    code, stdout, err = cli("calibrate", "--from-log", str(path), "--preset", "verl", "--grad-norms", str(noise),
                            "--mu", "5", "--out", str(profile))
    assert code == 0, err
    record = json.loads(profile.read_text())["noise_scale"]
    assert record["b_noise"] == pytest.approx(14.0, rel=1e-12)
    # the bootstrap resamples the 2 steps: step 3 twice gives tr Sigma 32 over |G|^2 2 = 16, step 4 twice 24 / 2 = 12
    assert record["b_noise_interval"] == pytest.approx([12.0, 16.0], rel=1e-12)
    assert (record["method"], record["batch"], record["unit_size"], record["checkpoints"]) == ("two-batch", 8, 1, 2)
    assert "B_noise = 14 samples" in stdout and "b = B_noise / B = 1.75 at B = 8" in stdout
    print("verl noise log -> calibrate: B_noise", record["b_noise"], "interval", record["b_noise_interval"],
          "(hand: 14)")
