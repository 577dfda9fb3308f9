"""The verl diagnose-log hook (integrations/verl.py) writes exactly what ``diagnose --preset verl`` reads.

Two kinds of batch go through the hook: one of exactly verl's ``DataProto`` shape (``batch``: (rows, L) torch
tensors, ``non_tensor_batch``: numpy object arrays, ``meta_info``), which always runs, and verl's real
``DataProto`` (``verl.protocol``) with its advantages from verl's own GRPO estimator and its metrics from verl's own
``compute_timing_metrics``, run where verl is installed.  Every statistic is compared with
``replay_theory.theory.divergences`` on the same arrays.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # verl batches hold torch tensors; without torch there is no verl

from replay_theory.diagnose import DiagnoseConfig, diagnose, resolve_columns  # noqa: E402 (after the importorskip)
from replay_theory.integrations.export import VERL_LOG_COLUMNS, VERL_VERSION_COLUMNS  # noqa: E402
from replay_theory.integrations.verl import VerlDiagnoseLogger, VerlDiagnoseLogMixin  # noqa: E402
from replay_theory.theory import divergences as dv  # noqa: E402

pytest.importorskip("pyarrow")

ROWS, L, G = 8, 7, 4  # responses per step, padded response length (verl's response_length), group size
# the steps a test run trains: verl's global_steps, the version each row's rollout started / ended under,
# and the step's timings (verl's timing_raw "gen" / "update_actor", seconds)
STEPS = (
    dict(step=3, start=[2, 2, 2, 2, 1, 1, 1, 1], end=[2, 2, 2, 2, 1, 2, 1, 1], gen=1.25, update=2.5),
    dict(step=4, start=[3, 3, 3, 3, 1, 1, 2, 2], end=[3, 3, 3, 3, 2, 1, 3, 2], gen=0.75, update=3.0),
)


def _arrays(seed: int) -> dict[str, np.ndarray]:
    """One step's response tensors, right-padded as verl holds them; tool-result tokens (0 mid-mask) included."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, L - 1, size=ROWS)  # the last 2 columns are padding on every row: cut by the hook
    mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int64)
    mask[0, 1] = 0  # a multi-turn tool result: verl's response_mask is 0 there
    rollout = np.where(mask == 1, -rng.exponential(1.0, size=(ROWS, L)), 0.0)  # padding holds 0.0
    old = np.where(mask == 1, np.minimum(rollout + 0.3 * rng.normal(size=(ROWS, L)), -1e-3), 0.0)
    outcome = rng.binomial(1, 0.5, size=ROWS).astype(np.float64)
    scores = np.zeros((ROWS, L))
    scores[np.arange(ROWS), lengths - 1] = outcome  # verl puts the outcome score on the last response token
    rewards = scores - 0.01 * mask  # as with verl's in-reward KL penalty
    adv = (outcome - np.repeat(outcome.reshape(-1, G).mean(axis=1), G))[:, None] * mask
    return dict(rollout_log_probs=rollout, old_log_probs=old, response_mask=mask, advantages=adv,
                token_level_scores=scores, token_level_rewards=rewards)


def _shaped_batch(arrays: dict[str, np.ndarray], spec: dict, versions: str = "min_global_steps") -> SimpleNamespace:
    """A batch of exactly DataProto's shape: float32 tensors as verl's workers return them."""
    tensors = {k: torch.tensor(v, dtype=torch.int64 if k == "response_mask" else torch.float32)
               for k, v in arrays.items()}
    start_key, end_key = {"min_global_steps": ("min_global_steps", "max_global_steps"),
                          "param_version_start": ("param_version_start", "param_version_end")}[versions]
    non_tensor = {"uid": np.array([f"uid-{spec['step']}-{i // G}" for i in range(ROWS)], dtype=object),
                  start_key: np.array(spec["start"], dtype=object), end_key: np.array(spec["end"], dtype=object)}
    return SimpleNamespace(batch=tensors, non_tensor_batch=non_tensor, meta_info={"temperature": 1.0})


def _metrics(spec: dict) -> dict[str, float]:
    return {"timing_s/gen": spec["gen"], "timing_s/update_actor": spec["update"], "timing_s/step": 9.0}


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float64)  # what the float32 tensors hold


def _expected(steps: list[tuple[dict, dict[str, np.ndarray]]]) -> dict:
    """Hand-computed log contents and statistics of the steps, from the arrays put into the hook."""
    keep, lr, token_age, token_reward = [], [], [], []
    for spec, a in steps:
        m = a["response_mask"].astype(bool)
        keep.append(m)
        lr.append((_f32(a["old_log_probs"]) - _f32(a["rollout_log_probs"]))[m])
        age = (spec["step"] - 1) - np.asarray(spec["start"])
        token_age.append(np.repeat(age, m.sum(axis=1)))
        token_reward.append(np.repeat(_f32(a["token_level_scores"]).sum(axis=1), m.sum(axis=1)))
    return dict(lr=np.concatenate(lr), age=np.concatenate(token_age), reward=np.concatenate(token_reward),
                n_tokens=int(sum(m.sum() for m in keep)))


def _check_log(path, steps, report) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert table.column_names == list(VERL_LOG_COLUMNS)
    assert pq.ParquetFile(path).metadata.num_row_groups == len(steps)  # one row group per step
    col = {name: table.column(name).to_pylist() for name in table.column_names}
    assert col["step"] == [spec["step"] for spec, _ in steps for _ in range(ROWS)]
    assert col["sample_id"] == list(range(len(steps) * ROWS))
    assert col["group_id"] == [i // G for i in range(len(steps) * ROWS)]  # uid -> 0, 1, 2, ... by first sight
    for name, key in (("policy_version", "start"), ("policy_version_end", "end")):
        assert col[name] == [v for spec, _ in steps for v in spec[key]]
    assert col["age"] == [spec["step"] - 1 - v for spec, _ in steps for v in spec["start"]]
    assert col["age_end"] == [spec["step"] - 1 - v for spec, _ in steps for v in spec["end"]]
    for name, key in (("step_generation_seconds", "gen"), ("step_update_seconds", "update")):
        assert col[name] == [spec[key] for spec, _ in steps for _ in range(ROWS)]
    assert col["step_generated_rows"] == [ROWS] * (len(steps) * ROWS)
    for name in ("scores", "rewards"):
        key = {"scores": "token_level_scores", "rewards": "token_level_rewards"}[name]
        want = np.concatenate([_f32(a[key]).sum(axis=1) for _, a in steps])
        assert np.allclose(col[name], want, rtol=0, atol=1e-12)
    # the per-token lists, cut to the longest response (L - 2 columns here), values as put in
    for name in ("rollout_log_probs", "old_log_probs", "response_mask", "advantages"):
        got = np.asarray(col[name], dtype=np.float64)
        want = np.concatenate([_f32(a[name])[:, :L - 2] for _, a in steps])
        assert got.shape == (len(steps) * ROWS, L - 2) and np.array_equal(got, want), name

    exp = _expected(steps)
    lr = exp["lr"]
    assert report["n_tokens"] == exp["n_tokens"] == lr.size
    assert report["n_sequences"] == len(steps) * ROWS
    assert report["kl_k3"] == pytest.approx(float(np.mean(np.expm1(lr) - lr)), rel=1e-12, abs=1e-15)
    assert report["kl_k3"] == pytest.approx(float(dv.kl_k3(lr)), rel=1e-12, abs=1e-15)
    assert report["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(lr)), rel=1e-12)
    assert report["m2"] == pytest.approx(float(dv.m2(lr)), rel=1e-12)
    assert report["ratio_min"] == pytest.approx(math.exp(lr.min()), rel=1e-12)
    ages = sorted(set(exp["age"].tolist()))
    assert [b["age"] for b in report["by_age"]] == ages == [0, 1, 2]
    for bucket in report["by_age"]:
        sub = lr[exp["age"] == bucket["age"]]
        assert bucket["n_tokens"] == sub.size
        assert bucket["ess_frac"] == pytest.approx(float(dv.ess_kish_fraction(sub)), rel=1e-12)
        assert bucket["kl_k3"] == pytest.approx(float(dv.kl_k3(sub)), rel=1e-12, abs=1e-15)
    assert report["mean_reward"] == pytest.approx(float(exp["reward"].mean()), rel=1e-12)


def test_hook_on_dataproto_shaped_batches_is_what_preset_verl_reads(tmp_path, cli):
    steps = [(spec, _arrays(seed)) for seed, spec in enumerate(STEPS)]
    path = tmp_path / "logs" / "verl.parquet"
    with VerlDiagnoseLogger(path) as log:
        assert not path.exists()  # created at the first batch
        for spec, arrays in steps:
            assert log(_shaped_batch(arrays, spec), _metrics(spec), spec["step"]) == ROWS
        assert log.rows_written == len(steps) * ROWS
    report = diagnose(DiagnoseConfig(path=str(path), preset="verl"))
    _check_log(path, steps, report)

    # the CLI reads it the same way, with no --columns
    code, out, err = cli("diagnose", str(path), "--preset", "verl", "--json", "--no-progress")
    assert code == 0, err
    cli_report = json.loads(out)
    for key in ("n_tokens", "n_sequences", "ess_frac", "kl_k3", "m2", "mean_reward"):
        assert cli_report[key] == report[key], key
    assert [b["age"] for b in cli_report["by_age"]] == [0, 1, 2]
    # the gap to the version the rollout ended under, and the KL-penalised reward, are one mapping away
    end = diagnose(DiagnoseConfig(path=str(path), preset="verl", columns="age=age_end,reward=rewards"))
    token_age_end = np.concatenate([np.repeat((spec["step"] - 1) - np.asarray(spec["end"]),
                                              a["response_mask"].sum(axis=1)) for spec, a in steps])
    assert [b["n_tokens"] for b in end["by_age"]] == [int((token_age_end == a).sum())
                                                      for a in sorted(set(token_age_end.tolist()))]
    token_rewards = np.concatenate([np.repeat(_f32(a["token_level_rewards"]).sum(axis=1),
                                              a["response_mask"].sum(axis=1)) for _, a in steps])
    assert end["mean_reward"] == pytest.approx(float(token_rewards.mean()), rel=1e-12)

    # calibrate --from-log reads the same file: mu from verl's timing_s/gen and timing_s/update_actor,
    # (sum gen / rows generated) / (sum update / rows trained) = ((1.25 + 0.75) / 16) / ((2.5 + 3.0) / 16)
    code, _, err = cli("calibrate", "--from-log", str(path), "--preset", "verl", "--out", str(tmp_path / "p.json"))
    assert code == 0, err
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["mu"]["value"] == pytest.approx(2.0 / 5.5, rel=1e-12)
    assert profile["staleness"] == [0, 1, 2]  # the ages the hook wrote


def test_fully_async_keys_before_verl_0_9_and_its_current_version(tmp_path):
    """param_version_start / _end (verl <= 0.8's fully-async trainer), ages against current_param_version."""
    spec = dict(STEPS[0], step=40)  # fully-async: global_steps counts local steps, versions count syncs
    path = tmp_path / "async.parquet"
    with VerlDiagnoseLogger(path) as log:
        log.log_batch(_shaped_batch(_arrays(0), spec, versions="param_version_start"), _metrics(spec), 40,
                      current_version=2)
    report = diagnose(DiagnoseConfig(path=str(path), preset="verl"))
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    assert table.column("age").to_pylist() == [2 - v for v in spec["start"]]
    assert table.column("age_end").to_pylist() == [2 - v for v in spec["end"]]
    mask = _arrays(0)["response_mask"]
    token_age = np.repeat(2 - np.asarray(spec["start"]), mask.sum(axis=1))
    assert [(b["age"], b["n_tokens"]) for b in report["by_age"]] == [(0, int((token_age == 0).sum())),
                                                                      (1, int((token_age == 1).sum()))]


def test_without_versions_the_version_columns_are_left_out(tmp_path):
    spec, arrays = STEPS[0], _arrays(0)
    batch = _shaped_batch(arrays, spec)
    for key in ("min_global_steps", "max_global_steps"):  # verl 0.9 keeps the keys; None = not reported
        batch.non_tensor_batch[key] = np.array([None] * ROWS, dtype=object)
    path = tmp_path / "noversions.parquet"
    with VerlDiagnoseLogger(path) as log:
        log(batch, _metrics(spec), spec["step"])
    import pyarrow.parquet as pq

    assert pq.read_table(path).column_names == [c for c in VERL_LOG_COLUMNS if c not in VERL_VERSION_COLUMNS]
    report = diagnose(DiagnoseConfig(path=str(path), preset="verl"))
    assert report["n_tokens"] == int(arrays["response_mask"].sum()) and report["by_age"] == []


def test_critic_warmup_step_writes_nothing(tmp_path):
    spec = STEPS[0]
    path = tmp_path / "warmup.parquet"
    log = VerlDiagnoseLogger(path)
    assert log(_shaped_batch(_arrays(0), spec), {"timing_s/gen": 1.0}, 1) == 0  # no actor update
    log.close()
    assert not path.exists() and log.rows_written == 0


@pytest.mark.parametrize("change, message", [
    (lambda b, m: b.batch.pop("rollout_log_probs"),
     "verl batch has no rollout_log_probs: set actor_rollout_ref.rollout.calculate_log_probs=True so the rollout "
     "returns its log-probs (the behaviour side of the ratio)"),
    (lambda b, m: b.batch.pop("advantages"),
     "verl batch has no advantages: call the hook after the actor update, where the batch holds old_log_probs, "
     "response_mask and advantages"),
    (lambda b, m: b.batch.pop("token_level_scores"),
     "verl batch has no token_level_scores: call the hook after the reward step"),
    (lambda b, m: m.pop("timing_s/gen"),
     "metrics has no 'timing_s/gen': pass the step's metrics after verl's compute_timing_metrics (right before "
     "logger.log)"),
    (lambda b, m: b.batch.__setitem__("advantages", b.batch["advantages"][:, :3]),
     f"verl batch: advantages has shape ({ROWS}, 3), response_mask ({ROWS}, {L})"),
    (lambda b, m: b.non_tensor_batch["min_global_steps"].__setitem__(0, None),
     f"verl batch: 1 of {ROWS} rows have no min_global_steps/max_global_steps; the diagnose log needs it on "
     "every row or on none"),
    (lambda b, m: b.non_tensor_batch["max_global_steps"].__setitem__(3, 5),
     "verl batch: a row was generated by weights version 5, after the current version 2: pass current_version= "
     "(the fully-async trainer's self.current_param_version)"),
])
def test_bad_batches_are_refused_with_one_line_and_nothing_written(tmp_path, change, message):
    spec = STEPS[0]
    batch, metrics = _shaped_batch(_arrays(0), spec), _metrics(spec)
    change(batch, metrics)
    path = tmp_path / "bad.parquet"
    log = VerlDiagnoseLogger(path)
    with pytest.raises(ValueError) as info:
        log(batch, metrics, spec["step"])
    assert str(info.value) == message
    log.close()
    assert not path.exists()


def test_a_log_is_never_overwritten(tmp_path):
    path = tmp_path / "old.parquet"
    path.write_bytes(b"results")
    with pytest.raises(ValueError) as info:
        VerlDiagnoseLogger(path)
    assert str(info.value) == f"diagnose log {path} exists: a log is never overwritten, give a new path"
    assert path.read_bytes() == b"results"


class _SplitStep:
    """A stand-in for verl 0.9's split step: the attributes SeparateRayPPOTrainer's _fit_update_actor uses and
    sets, and an async fit that runs it (as FullyAsyncTrainer's and OneStepOffRayTrainer's do)."""

    def __init__(self, timing_raw: dict) -> None:
        self.timing_raw, self.global_steps, self.updated = dict(timing_raw), 0, 0

    def _fit_update_actor(self, batch):
        self.updated += 1
        return batch

    async def fit(self, plan: list) -> str:
        for step, version, batch in plan:
            self.global_steps = step
            if version is not None:
                self.current_param_version = version
            if batch is None:
                self.timing_raw.pop("update_actor")  # critic warm-up: no update, no rows
                batch = plan[0][2]
            self._fit_update_actor(batch)
        return "done"


def test_mixin_logs_each_update_with_the_trainers_version_and_closes_after_fit(tmp_path):
    import asyncio

    import pyarrow.parquet as pq

    class Logged(VerlDiagnoseLogMixin, _SplitStep):
        pass

    spec, arrays = STEPS[0], _arrays(0)
    path = tmp_path / "mixin.parquet"
    trainer = Logged({"gen": spec["gen"], "update_actor": spec["update"]}, diagnose_log=path)
    batch = _shaped_batch(arrays, spec)
    # step 3 ages against global_steps - 1; then the fully-async trainer's current_param_version is used
    assert asyncio.run(trainer.fit([(spec["step"], None, batch), (17, 2, batch), (18, 2, None)])) == "done"
    assert trainer.diagnose_log.closed and trainer.updated == 3  # fit closed the log: readable at once
    table = pq.read_table(path)
    assert table.num_rows == 2 * ROWS
    assert table.column("step").to_pylist() == [spec["step"]] * ROWS + [17] * ROWS
    assert table.column("age").to_pylist() == [spec["step"] - 1 - v for v in spec["start"]] + [
        2 - v for v in spec["start"]]
    assert table.column("step_generation_seconds").to_pylist() == [spec["gen"]] * (2 * ROWS)
    assert table.column("step_update_seconds").to_pylist() == [spec["update"]] * (2 * ROWS)

    # the path comes from the trainer config too (verl: +trainer.diagnose_log=PATH), checked when it is made
    class Configured(VerlDiagnoseLogMixin, _SplitStep):
        config = SimpleNamespace(trainer={"diagnose_log": str(path)})

    with pytest.raises(ValueError, match="exists: a log is never overwritten"):
        Configured({})

    class OneStepOffRayTrainer(_SplitStep):  # pushes its weights at the start of step t, labelled t
        pass

    class LoggedOneStep(VerlDiagnoseLogMixin, OneStepOffRayTrainer):
        pass

    one_step = LoggedOneStep({})
    one_step.global_steps = 5
    assert one_step.diagnose_current_version() == 5 and one_step.diagnose_log is None


def test_preset_verl_names_the_hooks_columns_and_the_example_has_them(tmp_path, cli):
    cmap = resolve_columns("verl")
    assert (cmap.logp_behav, cmap.logp_current, cmap.mask, cmap.advantage, cmap.age, cmap.reward) == (
        "rollout_log_probs", "old_log_probs", "response_mask", "advantages", "age", "scores")
    assert set(cmap.columns().values()) <= set(VERL_LOG_COLUMNS) and cmap.layout == "wide"

    from replay_theory.experiments.example_log import example_log, write_example

    path = tmp_path / "verl_example.parquet"
    truth = write_example(path, "verl", seed=5)
    import pyarrow.parquet as pq

    assert set(pq.read_table(path).column_names) == (set(VERL_LOG_COLUMNS) - {
        "step_generation_seconds", "step_update_seconds", "step_generated_rows"}) | {"version_gap"}
    code, out, err = cli("diagnose", str(path), "--preset", "verl", "--json", "--no-progress")
    assert code == 0, err
    report = json.loads(out)
    columns, _ = example_log(np.random.default_rng(5))
    assert report["n_tokens"] == columns["logp_behav"].size
    assert [b["age"] for b in report["by_age"]] == truth["age"].tolist()
    assert [b["n_tokens"] for b in report["by_age"]] == [int((columns["age"] == a).sum()) for a in truth["age"]]
    assert report["mean_reward"] == pytest.approx(float(columns["reward"].mean()), rel=1e-12)
    # the older command (age mapped to version_gap) reads the same ages
    older = diagnose(DiagnoseConfig(path=str(path), preset="verl", columns="age=version_gap"))
    assert [b["n_tokens"] for b in older["by_age"]] == [b["n_tokens"] for b in report["by_age"]]


# --------------------------------------------------------------------------- verl's real code


def test_hook_on_verls_real_dataproto(tmp_path, cli):
    """verl's DataProto (verl.protocol), GRPO advantages from verl's estimator, metrics from verl's own
    compute_timing_metrics: the keys and shapes verl's RayPPOTrainer.fit holds before logger.log."""
    protocol = pytest.importorskip("verl.protocol")
    DataProto = protocol.DataProto
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    metric_utils = pytest.importorskip("verl.trainer.ppo.metric_utils")

    steps, path = [], tmp_path / "real.parquet"
    with VerlDiagnoseLogger(path) as log:
        for seed, spec in enumerate(STEPS):
            a = _arrays(seed)
            prompt_len = 3
            mask = torch.tensor(a["response_mask"])
            uid = np.array([f"uid-{spec['step']}-{i // G}" for i in range(ROWS)], dtype=object)
            rewards = torch.tensor(a["token_level_rewards"], dtype=torch.float32)
            # verl's GRPO outcome advantage (group by uid), the estimator RayPPOTrainer calls in compute_advantage
            adv, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards=rewards, response_mask=mask,
                                                               index=uid)
            a["advantages"] = adv.double().numpy()
            attention = torch.cat([torch.ones(ROWS, prompt_len, dtype=torch.int64), (mask > 0).long()], dim=1)
            attention[0, prompt_len + 1] = 1  # the tool-result token is attended to, not trained on
            batch = DataProto.from_dict(
                tensors={"prompts": torch.zeros(ROWS, prompt_len, dtype=torch.int64),
                         "responses": torch.zeros(ROWS, L, dtype=torch.int64), "attention_mask": attention,
                         "response_mask": mask,
                         "rollout_log_probs": torch.tensor(a["rollout_log_probs"], dtype=torch.float32),
                         "old_log_probs": torch.tensor(a["old_log_probs"], dtype=torch.float32),
                         "advantages": adv, "token_level_scores": torch.tensor(a["token_level_scores"],
                                                                               dtype=torch.float32),
                         "token_level_rewards": rewards},
                non_tensors={"uid": uid, "min_global_steps": np.array(spec["start"], dtype=object),
                             "max_global_steps": np.array(spec["end"], dtype=object)},
                meta_info={"temperature": 1.0})
            metrics = metric_utils.compute_timing_metrics(batch=batch, timing_raw={
                "gen": spec["gen"], "update_actor": spec["update"], "step": 9.0})
            assert log(batch, metrics, spec["step"]) == len(batch) == ROWS
            steps.append((spec, a))
    report = diagnose(DiagnoseConfig(path=str(path), preset="verl"))
    _check_log(path, steps, report)
    code, out, err = cli("diagnose", str(path), "--preset", "verl", "--json", "--no-progress")
    assert code == 0, err
    assert json.loads(out)["n_tokens"] == report["n_tokens"]


def test_mixin_on_verls_real_split_step(tmp_path):
    """VerlDiagnoseLogMixin over verl's own SeparateRayPPOTrainer._fit_update_actor (its marked_timer fills
    timing_raw["update_actor"]); the actor's update itself is a stub (no GPU, no Ray cluster)."""
    separation = pytest.importorskip("verl.experimental.separation.ray_trainer")
    DataProto = pytest.importorskip("verl.protocol").DataProto
    from omegaconf import OmegaConf

    class Logged(VerlDiagnoseLogMixin, separation.SeparateRayPPOTrainer):
        def _update_actor(self, batch):
            return DataProto.from_dict(tensors={"x": torch.zeros(1)}, meta_info={"metrics": {"actor/pg_loss": [0.5]}})

    spec, a = STEPS[0], _arrays(0)
    trainer = object.__new__(Logged)  # verl's constructor builds Ray worker groups; the step needs only these
    trainer.config = OmegaConf.create({"trainer": {"critic_warmup": 0}})
    trainer.metrics, trainer.timing_raw, trainer.global_steps = {}, {"gen": spec["gen"]}, spec["step"]
    trainer.diagnose_log = VerlDiagnoseLogger(tmp_path / "split.parquet")
    tensors = {k: torch.tensor(v, dtype=torch.int64 if k == "response_mask" else torch.float32) for k, v in a.items()}
    batch = DataProto.from_dict(tensors=tensors, non_tensors={
        "uid": np.array([f"u{i // G}" for i in range(ROWS)], dtype=object),
        "min_global_steps": np.array(spec["start"], dtype=object),
        "max_global_steps": np.array(spec["end"], dtype=object)})
    assert trainer._fit_update_actor(batch) is batch
    trainer.diagnose_log.close()
    assert trainer.metrics == {"actor/pg_loss": 0.5}  # verl's own code ran
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "split.parquet")
    assert table.column("step_update_seconds").to_pylist() == [trainer.timing_raw["update_actor"]] * ROWS
    assert table.column("age").to_pylist() == [spec["step"] - 1 - v for v in spec["start"]]
    report = diagnose(DiagnoseConfig(path=str(tmp_path / "split.parquet"), preset="verl"))
    assert report["n_tokens"] == int(a["response_mask"].sum())
