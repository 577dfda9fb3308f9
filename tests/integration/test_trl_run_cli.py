"""``replay-theory trl-replay`` for a new user: options checked first, quiet stdout, cached warm start, regime line.

The checks and the cache key need no torch; the runs (marked slow) train TRL's real GRPOTrainer on the tiny Qwen2
for a few steps on CPU, with the warm-start cache in a temporary folder.
"""

import importlib.util
import json
import sys
from itertools import combinations_with_replacement

import pytest

from replay_theory.validate import trl_run
from replay_theory.validate.trl_run import (
    CACHE_ENV,
    COUNTDOWN_DISTINCT,
    MAX_N_TRAIN,
    TRAINER_LOG_NAME,
    TrlRunConfig,
    default_cache_dir,
    reward_quarters,
    warm_start_path,
    zero_share_of_history,
)

BY_HAND = ["--capacity", "16", "--batch-size", "12", "--rollouts-per-step", "8", "--group-size", "4"]


def needs_trl_extra() -> None:
    """Skip unless trl-replay's dependency check passes (the trl extra: what cli/trl_cmds.py looks for)."""
    for module in ("torch", "trl", "datasets", "transformers"):
        pytest.importorskip(module)


@pytest.fixture
def no_warm_start(monkeypatch):
    """The warm start fails the test if it runs: a check must come before it. Without torch (the README's
    `pip install -e ".[test]"`) there is no warm start to guard: trl-replay cannot reach it, and a check that came
    after the missing-dependency line would show up as that line instead of the expected one."""
    if importlib.util.find_spec("torch") is None:
        return
    from replay_theory.validate import sft

    def no_sft(*a, **k):
        raise AssertionError("the warm start ran")

    monkeypatch.setattr(sft, "sft_warm_start", no_sft)


@pytest.mark.parametrize("args, message", [
    # TRL's GRPOConfig: generation_batch_size (R) % num_generations (G), after the warm start, in TRL's names
    (["--capacity", "12", "--batch-size", "6", "--rollouts-per-step", "6", "--group-size", "4"],
     "--rollouts-per-step must be a multiple of --group-size = 4 (whole prompt groups), got 6"),
    # the trainer's buffer (integrations/buffer.py), at the trainer's construction
    (["--capacity", "10", "--batch-size", "8", "--rollouts-per-step", "8", "--group-size", "4"],
     "--capacity must be a multiple of --group-size = 4 (whole groups are stored), got 10"),
    (["--capacity", "4", "--batch-size", "8", "--rollouts-per-step", "8", "--group-size", "4"],
     "--capacity must be >= --rollouts-per-step = 8 (a FIFO holds at least one step), got 4"),
    (["--capacity", "16", "--batch-size", "6", "--rollouts-per-step", "8", "--buffer", "on-policy"],
     "--batch-size must equal --rollouts-per-step = 8 on-policy (every rollout trained once), got 6"),
    # TRL's RepeatSampler drops a batch of fewer than R/G prompts; the Countdown family holds 1721 problems
    ([*BY_HAND, "--n-train", "1"],
     "--n-train must be in [2, 1657] (R/G = 8/4 prompts a step; 1721 distinct problems, 64 held out), got 1"),
    ([*BY_HAND, "--n-train", "1658"],
     "--n-train must be in [2, 1657] (R/G = 8/4 prompts a step; 1721 distinct problems, 64 held out), got 1658"),
    ([*BY_HAND, "--group-size", "1"], "--group-size must be an integer >= 2, got 1"),
    ([*BY_HAND, "--temperature", "0"], "--temperature must be a finite number > 0, got 0.0"),
    ([*BY_HAND, "--device", "tpu"], "--device must be cpu or cuda (cuda:N), got 'tpu'"),
    ([*BY_HAND, "--device", "cuda:x"], "--device must be cpu or cuda (cuda:N), got 'cuda:x'"),
])
def test_bad_input_is_one_line_in_the_options_names_before_any_work(error_line, tmp_path, no_warm_start, args,
                                                                     message):
    out = tmp_path / "run"
    assert error_line("trl-replay", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), *args) == message
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_generator_stall_names_n_train_before_the_warm_start(error_line, tmp_path, monkeypatch):
    # near the family's size the generator may never draw a rare problem (make_splits gives up): one line naming
    # --n-train, before the warm start and before --out is made; the command gets that far only with the trl extra
    needs_trl_extra()
    from replay_theory.validate import sft
    from replay_theory.validate.config import ValidateConfig

    def stalled(self):
        raise ValueError("cannot find 1721 distinct problems with {...}")

    def no_sft(*a, **k):
        raise AssertionError("the warm start ran")

    monkeypatch.setattr(ValidateConfig, "problems", stalled)
    monkeypatch.setattr(sft, "sft_warm_start", no_sft)
    line = error_line("trl-replay", "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"),
                      *BY_HAND, "--n-train", "1657")
    assert line == ("--n-train 1657: seed 0's problem generator stalls before 1657 + 64 held-out distinct problems "
                    "(cannot find 1721 distinct problems with {...}): use a smaller --n-train")
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_a_cache_dir_that_is_a_file_is_refused(error_line, tmp_path):
    (tmp_path / "cache").write_text("x")
    line = error_line("trl-replay", "--out", str(tmp_path / "run"), "--cache-dir", str(tmp_path / "cache"),
                      *BY_HAND)
    assert line == f"--cache-dir (or ${CACHE_ENV}) {tmp_path / 'cache'} is not a directory"
    assert not (tmp_path / "run").exists()


def test_countdown_family_size_is_the_solvers_count():
    # MAX_N_TRAIN = the distinct solvable problems (three numbers 1-9, target 1-40) less the 64 held out
    from replay_theory.validate import countdown

    count = sum(1 for numbers in combinations_with_replacement(range(1, 10), 3) for target in range(1, 41)
                if countdown.solve(countdown.Problem(numbers, target)) is not None)
    assert count == COUNTDOWN_DISTINCT == 1721 and MAX_N_TRAIN == 1657


@pytest.mark.parametrize("n, b, r, line", [
    (8, 8, 8, "regime: on-policy (N = B = R = 8): every rollout is trained once, in the step that generated it; "
              "no replay"),
    (16, 4, 8, "regime: over-generation, not replay (y = B/R = 4/8 = 0.5 < 1): some rollouts are never trained "
               "on; raise --batch-size to R or cut --rollouts-per-step to B"),
    (16, 12, 8, None),  # replay: y = 1.5
    (16, 8, 8, None),  # a buffer without reuse (y = 1, x = 2): not one of the two named regimes
])
def test_regime_line(n, b, r, line):
    config = TrlRunConfig(capacity=n, batch_size=b, rollouts_per_step=r, group_size=4).validated()
    assert config.regime_line() == line


def test_warm_start_cache_key_and_folder(tmp_path, monkeypatch):
    base = TrlRunConfig(capacity=16, batch_size=12, rollouts_per_step=8, group_size=4)
    path = warm_start_path(base, tmp_path)
    assert path.parent == tmp_path and path.name.startswith(f"warm-start-{trl_run.__version__}-")
    # the RL options do not touch the warm start; every SFT input does
    same = TrlRunConfig(capacity=32, batch_size=8, rollouts_per_step=16, group_size=8, steps=3,
                        lr=1e-4, loss="tis", temperature=0.5)
    assert warm_start_path(same, tmp_path) == path
    for change in ({"seed": 1}, {"sft_steps": 599}, {"n_train": 999}, {"threads": 2}):
        assert warm_start_path(TrlRunConfig(**{**base.__dict__, **change}), tmp_path) != path, change
    monkeypatch.setattr(trl_run, "__version__", "9.9.9")  # a new code version never reads the old weights
    assert warm_start_path(base, tmp_path) != path
    # the folder: $REPLAY_THEORY_CACHE, else $XDG_CACHE_HOME/replay-theory, else ~/.cache/replay-theory
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "replay-theory"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "replay-theory"


@pytest.mark.slow
def test_second_run_loads_the_cached_warm_start_and_trains_the_same(cli, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    import pyarrow.parquet as pq

    from replay_theory.validate import sft

    calls = []
    real_sft = sft.sft_warm_start

    def counting_sft(*a, **k):
        calls.append(k["steps"])
        return real_sft(*a, **k)

    monkeypatch.setattr(sft, "sft_warm_start", counting_sft)
    cache = tmp_path / "cache"
    args = [*BY_HAND, "--steps", "3", "--sft-steps", "10", "--n-train", "32", "--no-progress", "--cache-dir",
            str(cache)]
    code, first, stderr = cli("trl-replay", "--out", str(tmp_path / "a"), *args)
    assert code == 0, stderr
    assert calls == [10]
    cached = warm_start_path(TrlRunConfig(sft_steps=10, n_train=32), cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted([cached.name, cached.with_suffix(".json").name])
    assert json.loads(cached.with_suffix(".json").read_text())["sft_steps"] == 10

    def no_sft(*a, **k):
        raise AssertionError("the second run repeated the SFT")

    monkeypatch.setattr(sft, "sft_warm_start", no_sft)
    code, second, stderr = cli("trl-replay", "--out", str(tmp_path / "b"), *args)
    assert code == 0, stderr
    assert f"warm start: cached {cached}" in first and f"warm start: loaded {cached}" in second

    # bit for bit: the same rows, log-probs and advantages (wall-clock columns aside), the same per-step metrics
    tables = [pq.read_table(tmp_path / name / "rollouts.parquet") for name in ("a", "b")]
    tables = [t.select([c for c in t.column_names if not c.endswith("_seconds")]) for t in tables]
    assert tables[0].num_rows == 3 * 12 and tables[0].equals(tables[1])
    runs = [json.loads((tmp_path / name / "run.json").read_text()) for name in ("a", "b")]
    timing = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time")

    def metrics(history):
        return [{k: v for k, v in h.items() if k not in timing} for h in history]

    assert metrics(runs[0]["history"]) == metrics(runs[1]["history"])
    assert runs[0]["noise_scale"] == runs[1]["noise_scale"]

    # stdout: the summary only; TRL's per-step dicts are in trainer_log.jsonl, the same steps run.json keeps
    lines = second.splitlines()
    assert [line.split()[0].rstrip(":") for line in lines] == ["warm", "trained", "reward", "B_noise", "drift",
                                                               "wrote", "next"]
    assert runs[0]["drift"]["m2"] == runs[1]["drift"]["m2"] and runs[1]["drift"]["staleness"] == [0, 1, 2, 3]
    assert not any(line.lstrip().startswith("{") for line in lines)
    logged = [json.loads(line) for line in (tmp_path / "b" / TRAINER_LOG_NAME).read_text().splitlines()]
    per_step = [row for row in logged if "replay/replay_ratio" in row]
    assert [row["step"] for row in per_step] == [1, 2, 3]
    assert [row["reward"] for row in per_step] == [h["reward"] for h in runs[1]["history"]]
    assert str(tmp_path / "b" / TRAINER_LOG_NAME) in lines[5]


def test_gpu_extra_is_trls_vllm_range(repo_root):
    # pyproject's gpu extra allows exactly the vLLM versions the installed TRL's own vllm extra does (TRL 1.16:
    # >= 0.22.0, <= 0.31.0)
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement  # pytest's own dependency

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    try:
        trl_requires = requires("trl") or []
    except PackageNotFoundError:
        pytest.skip("trl is not installed")
    trl_vllm = [Requirement(r) for r in trl_requires if Requirement(r).name == "vllm"]
    pyproject = tomllib.loads((repo_root / "pyproject.toml").read_text())
    ours = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["gpu"]]
    assert [r.name for r in ours] == ["vllm"] and len(trl_vllm) == 1
    assert ours[0].specifier == trl_vllm[0].specifier
    assert [v for v in ("0.21.9", "0.22.0", "0.31.0", "0.31.1", "0.33.0") if v in ours[0].specifier] == \
        ["0.22.0", "0.31.0"]


def test_cuda_without_a_gpu_is_one_line_before_any_work(error_line, tmp_path, monkeypatch):
    # --device cuda on a machine without a GPU: validate's own refusal (validate/policy.resolve_device), before the
    # warm start and before --out is made; the command gets that far only with the trl extra installed
    needs_trl_extra()
    import torch

    from replay_theory.validate import sft

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sft, "sft_warm_start", lambda *a, **k: (_ for _ in ()).throw(AssertionError("SFT ran")))
    out = tmp_path / "run"
    line = error_line("trl-replay", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), *BY_HAND,
                      "--device", "cuda")
    assert line == "CUDA requested but torch.cuda.is_available() is False; use --device cpu"
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_without_the_trl_extra_is_one_line_with_the_cpu_install(error_line, tmp_path, monkeypatch):
    # the advice is PyTorch's CPU index, not a pinned PyPI torch (the CUDA build anywhere but the CI machine)
    for module in ("trl", "datasets", "torch", "transformers"):  # absent, whether or not this machine has them
        monkeypatch.setitem(sys.modules, module, None)  # importlib.util.find_spec then answers None
    out = tmp_path / "run"
    assert error_line("trl-replay", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), *BY_HAND) == (
        "trl-replay needs trl, datasets, torch, transformers: pip install 'replay-theory[trl]' (without a CUDA GPU, "
        "first pip install torch --index-url https://download.pytorch.org/whl/cpu)")
    assert not out.exists() and not (tmp_path / "cache").exists()


RESUME_ARGS = [*BY_HAND, "--steps", "5", "--sft-steps", "10", "--n-train", "4", "--save-every", "2",
               "--no-progress"]  # 4 problems, R/G = 2 a step: an epoch every 2 steps, so a resume crosses epochs
TIMING = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time", "train_loss")


def _records(out):
    """Everything a run decided, without wall-clock values: the log's rows, the per-step metrics, the noise records,
    the drift log's rows (the kept rollouts re-scored at the end: a resumed run kept them in its checkpoint)."""
    import pyarrow.parquet as pq

    table = pq.read_table(out / "rollouts.parquet")
    table = table.select([c for c in table.column_names if not c.endswith("_seconds")])
    run = json.loads((out / "run.json").read_text())
    steps = [{k: v for k, v in json.loads(line).items() if k not in TIMING}
             for line in (out / TRAINER_LOG_NAME).read_text().splitlines()]
    noise = (out / "noise_scale.jsonl").read_text()
    drift = pq.read_table(out / "drift.parquet").to_pydict()
    return table, [{k: v for k, v in h.items() if k not in TIMING} for h in run["history"]], steps[:-1], noise, \
        (run["generated"], run["trained"], run["noise_scale"], run["drift"]), drift


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_numbers_of_an_uninterrupted_one(cli, tmp_path, monkeypatch, capsys):
    # Ctrl-C after step 3 (a checkpoint then, mid-epoch), and a crash in step 4 (the checkpoint of step 2, at an
    # epoch boundary): the same command continues each, and both end with what the uninterrupted run wrote
    needs_trl_extra()
    import os
    import signal

    from replay_theory.integrations.trl import ReplayGRPOTrainer

    cache = ["--cache-dir", str(tmp_path / "cache")]
    code, _, err = cli("trl-replay", "--out", str(tmp_path / "whole"), *RESUME_ARGS, *cache)
    assert code == 0, err
    whole = _records(tmp_path / "whole")
    assert whole[0].num_rows == 5 * 12 and len(whole[1]) == 5

    real_step = ReplayGRPOTrainer.training_step

    def interrupt_at(done: int, how: str):
        def training_step(self, *args, **kwargs):
            if self.state.global_step == done:  # steps done so far: this call trains step done + 1
                if how == "crash":
                    raise RuntimeError("injected crash")
                os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C: the handler asks for a save and a stop
            return real_step(self, *args, **kwargs)
        monkeypatch.setattr(ReplayGRPOTrainer, "training_step", training_step)

    out = tmp_path / "ctrl-c"
    interrupt_at(2, "ctrl-c")
    code, stdout, err = cli("trl-replay", "--out", str(out), *RESUME_ARGS, *cache)
    assert code == 130
    assert err.splitlines()[-1] == (f"interrupted after step 3 of 5: model, optimizer, buffer and random state of "
                                    f"step 3 are saved in {out / 'checkpoints' / 'checkpoint-3'}; run the same "
                                    "command to continue from step 4")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "rollouts.parquet.parts"]  # no result yet

    crashed = tmp_path / "crash"
    interrupt_at(3, "crash")
    with pytest.raises(RuntimeError, match="injected crash"):  # a real crash: its traceback is the user's clue
        cli("trl-replay", "--out", str(crashed), *RESUME_ARGS, *cache)
    capsys.readouterr()  # the crashed run's output, which the cli fixture did not get to read
    assert [p.name for p in (crashed / "checkpoints").glob("checkpoint-*")] == ["checkpoint-2"]

    monkeypatch.setattr(ReplayGRPOTrainer, "training_step", real_step)
    for folder, step in ((out, 3), (crashed, 2)):
        code, stdout, err = cli("trl-replay", "--out", str(folder), *RESUME_ARGS, *cache)
        assert code == 0, err
        checkpoint = folder / "checkpoints" / f"checkpoint-{step}"
        assert stdout.splitlines()[0] == (f"resuming from step {step} of 5 ({checkpoint}): model, optimizer, buffer "
                                          "and random state as saved")
        assert stdout.splitlines()[1].startswith(f"trained steps {step + 1}-5 of 5 (resumed) in ")
        resumed = _records(folder)
        assert resumed[0].equals(whole[0])
        assert resumed[1:] == whole[1:]
        assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (tmp_path / "whole").iterdir())


def _crash_in_step_4_and_resume(cli, tmp_path, monkeypatch, capsys, args: list[str]) -> tuple:
    """The uninterrupted run of ``args`` and the same run crashed in step 4 and continued by the same command (from
    the checkpoint of step 2): both runs' ``_records``, after checking the continuation said where it resumed."""
    from replay_theory.integrations.trl import ReplayGRPOTrainer

    code, _, err = cli("trl-replay", "--out", str(tmp_path / "whole"), *args)
    assert code == 0, err
    real_step = ReplayGRPOTrainer.training_step

    def training_step(self, *a, **kw):
        if self.state.global_step == 3:
            raise RuntimeError("injected crash")
        return real_step(self, *a, **kw)

    monkeypatch.setattr(ReplayGRPOTrainer, "training_step", training_step)
    with pytest.raises(RuntimeError, match="injected crash"):
        cli("trl-replay", "--out", str(tmp_path / "crash"), *args)
    capsys.readouterr()
    monkeypatch.setattr(ReplayGRPOTrainer, "training_step", real_step)
    code, stdout, err = cli("trl-replay", "--out", str(tmp_path / "crash"), *args)
    assert code == 0, err
    assert stdout.splitlines()[1].startswith("resuming from step 2 of 5")  # after the regime line
    return _records(tmp_path / "whole"), _records(tmp_path / "crash")


@pytest.mark.slow
def test_a_crashed_stale_k_run_resumes_to_the_numbers_of_an_uninterrupted_one(cli, tmp_path, monkeypatch, capsys):
    # buffer stale-k (k = 2): a crash in step 4 resumes from the checkpoint of step 2, whose queue holds the
    # generations of steps 0..2 (arrays only, core/state.py); the rest of the run is the uninterrupted run's
    needs_trl_extra()
    args = ["--buffer", "stale-k", "--stale-k", "2", "--rollouts-per-step", "4", "--group-size", "2", "--steps", "5",
            "--sft-steps", "10", "--n-train", "4", "--save-every", "2", "--no-progress",
            "--cache-dir", str(tmp_path / "cache")]
    whole, resumed = _crash_in_step_4_and_resume(cli, tmp_path, monkeypatch, capsys, args)
    assert whole[4][:2] == (4 * (2 + 5), 4 * 5)  # generated: 2 base generations and one a step; trained: R a step
    assert resumed[0].equals(whole[0])
    assert resumed[1:] == whole[1:]


def _short_run(cli, tmp_path, *options: str) -> tuple[str, dict]:
    """A finished trl-replay run of ``options`` on the tiny model after 10 SFT steps over 8 problems, into
    ``tmp_path / "run"``: its stdout and run.json."""
    out = tmp_path / "run"
    code, stdout, err = cli("trl-replay", *options, "--sft-steps", "10", "--n-train", "8", "--no-progress",
                            "--out", str(out), "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, err
    return stdout, json.loads((out / "run.json").read_text())


@pytest.mark.slow
def test_a_buffer_epochs_run_reports_the_reward_of_its_generations(cli, tmp_path):
    # e = 2 epochs over m = 2 mini-batches: TRL logs a generation's reward at the step that made it only (steps 1, 5
    # of 8), and the summary averages those; it raised KeyError: 'reward' at the end of the run before
    needs_trl_extra()
    stdout, run = _short_run(cli, tmp_path, "--buffer", "epochs", "--rollouts-per-step", "8", "--group-size", "4",
                             "--epochs", "2", "--mini-batches", "2", "--steps", "8", "--save-every", "4")
    rewards = [h["reward"] for h in run["history"] if "reward" in h]
    assert [h["step"] for h in run["history"] if "reward" in h] == [1, 5] and len(run["history"]) == 8
    assert (run["reward_first_quarter"], run["reward_last_quarter"]) == (rewards[0], rewards[-1])
    assert f"reward: {rewards[0]:.3f} (first 1 generations) -> {rewards[-1]:.3f} (last 1)" in stdout


@pytest.mark.slow
def test_a_dynamic_sampling_run_counts_its_refill_rounds(cli, tmp_path):
    # buffer dynamic (DAPO): every step's generation batches until B = 4 rows have unequal group rewards; run.json
    # and the summary give the rounds a step took beside E[T] at the run's z ([E11])
    needs_trl_extra()
    from replay_theory.theory.compute import refill_rounds

    stdout, run = _short_run(cli, tmp_path, "--buffer", "dynamic", "--rollouts-per-step", "4", "--group-size", "2",
                             "--steps", "4", "--save-every", "2")
    assert stdout.startswith("regime: dynamic sampling (DAPO): generation batches of R = B = 4 until 4 rollouts")
    rounds = [h["replay/refill_rounds"] for h in run["history"]]
    refill = run["refill_rounds"]
    assert refill["mean"] == sum(rounds) / 4 and run["generated"] == 4 * sum(rounds) and run["trained"] == 16
    assert refill["zero_share"] == run["zero_share"]["value"]
    assert refill["predicted"] == float(refill_rounds(2, refill["zero_share"]))
    assert (f"refill rounds: {refill['mean']:.2f} generation batches a step over 4 steps; E[T] = "
            f"{refill['predicted']:.2f} at the run's z = {refill['zero_share']:.3f} for g = 2 groups") in stdout


@pytest.mark.slow
def test_a_crashed_dynamic_run_resumes_to_the_numbers_of_an_uninterrupted_one(cli, tmp_path, monkeypatch, capsys):
    # buffer dynamic keeps nothing across steps, and a refill's prompts come from (seed, step, round): a crash in
    # step 4 resumes from the checkpoint of step 2 and trains the uninterrupted run's rows, rounds and numbers
    needs_trl_extra()
    args = ["--buffer", "dynamic", "--rollouts-per-step", "4", "--group-size", "2", "--steps", "5",
            "--sft-steps", "10", "--n-train", "8", "--save-every", "2", "--no-progress",
            "--cache-dir", str(tmp_path / "cache")]
    whole, resumed = _crash_in_step_4_and_resume(cli, tmp_path, monkeypatch, capsys, args)
    assert resumed[0].equals(whole[0])
    assert resumed[1:] == whole[1:]
    assert max(h["replay/refill_rounds"] for h in whole[1]) > 1  # the run refilled: the resumed refills were checked


def test_a_dynamic_answer_runs_as_buffer_dynamic(tmp_path):
    # optimal's dynamic-sampling answer (regime dynamic, N = B = R) read by --design: buffer dynamic at its B
    design = tmp_path / "design.json"
    answer = {"objective": "forgetting", "measured": True, "regime": "dynamic", "winner": "dynamic",
              "batch_size": 16, "rollouts_per_step": 16, "capacity": 16, "mu": 0.5}
    design.write_text(json.dumps(answer))
    replay = TrlRunConfig(design=str(design), group_size=8, steps=3).validated().replay_config()
    assert (replay.buffer, replay.capacity, replay.batch_size, replay.rollouts_per_step) == ("dynamic", 16, 16, 16)
    with pytest.raises(ValueError) as info:
        TrlRunConfig(design=str(design), buffer="selective", group_size=8, steps=3).validated()
    assert str(info.value).startswith(f"--design {design}: the optimal --json output answers dynamic sampling at "
                                      "B = 16")
    by_hand = TrlRunConfig(buffer="dynamic", rollouts_per_step=16, group_size=8).validated().replay_config()
    assert (by_hand.capacity, by_hand.batch_size) == (16, 16)
    with pytest.raises(ValueError) as info:
        TrlRunConfig(buffer="dynamic", rollouts_per_step=16, batch_size=8, group_size=8).validated()
    assert str(info.value) == ("--rollouts-per-step must equal --batch-size = 8 with buffer dynamic (rounds of B "
                               "generated until B are informative, each trained once), got 16")


def test_reward_quarters_average_the_steps_that_logged_a_reward():
    # every step logged one: 8 steps, quarters of 2: (0.1 + 0.2) / 2 and (0.7 + 0.8) / 2
    steps = [{"step": i + 1, "reward": 0.1 * (i + 1)} for i in range(8)]
    first, last, k, unit = reward_quarters(steps)
    assert (round(first, 12), round(last, 12), k, unit) == (0.15, 0.75, 2, "steps")
    # buffer epochs: only steps 1 and 5 logged one (two generations), quarters of 1
    epochs = [{"step": i + 1, **({"reward": 0.3 if i == 0 else 0.5} if i in (0, 4) else {})} for i in range(8)]
    assert reward_quarters(epochs) == (0.3, 0.5, 1, "generations")
    # none logged: said, not averaged to 0
    assert reward_quarters([{"step": 1}]) == (None, None, 1, "generations")


def test_an_overlapped_answer_runs_as_stale_k_with_the_answers_k(tmp_path):
    # optimal's overlapped answer (max_staleness = k, N = B = R) with --buffer stale-k: k and the sizes are the
    # answer's (not --stale-k's default 4), the note and the regime line say there is no overlap
    design = tmp_path / "design.json"
    answer = {"objective": "forgetting", "measured": True, "regime": "overlapped", "winner": "overlapped",
              "max_staleness": 2, "batch_size": 16, "rollouts_per_step": 16, "capacity": 16, "mu": 1.0}
    design.write_text(json.dumps(answer))
    config = TrlRunConfig(design=str(design), buffer="stale-k", group_size=8, steps=3).validated()
    replay = config.replay_config()
    assert (replay.capacity, replay.batch_size, replay.rollouts_per_step, replay.shared.stale_k) == (16, 16, 16, 2)
    assert config.regime_line().startswith("regime: 2-step-off (stale-k, M2PO Sec. 3): each update trains the whole "
                                           "generation of R = 16 made 2 update(s) earlier")
    design.write_text(json.dumps(answer | {"max_staleness": 5}))
    with pytest.raises(ValueError) as info:
        TrlRunConfig(design=str(design), buffer="stale-k", group_size=8, steps=3).validated()
    assert str(info.value) == ("--design's max_staleness must be in [0, 3] (--steps = 3: the first k updates train "
                               "the base model's generations), got 5")


def test_a_selective_answer_runs_as_buffer_selective(tmp_path):
    # optimal --zero-share's selective answer (a FIFO admitting only the groups of unequal rewards): trl-replay
    # --design runs it with buffer selective and its sizes, whatever the default --buffer; another buffer is refused
    design = tmp_path / "design.json"
    answer = {"objective": "forgetting", "measured": True, "regime": "selective", "winner": "selective",
              "zero_share": 0.4, "batch_size": 24, "rollouts_per_step": 16, "capacity": 64, "mu": 1.0}
    design.write_text(json.dumps(answer))
    replay = TrlRunConfig(design=str(design), group_size=8, steps=3).validated().replay_config()
    assert replay.buffer == "selective"
    assert (replay.capacity, replay.batch_size, replay.rollouts_per_step) == (64, 24, 16)
    assert replay.notes[0].startswith("selective replay run as buffer selective: only the groups whose rewards are "
                                      "not all equal enter the FIFO (the answer priced a zero share z = 0.4)")
    with pytest.raises(ValueError, match="which buffer prioritized does not run"):
        TrlRunConfig(design=str(design), buffer="prioritized", group_size=8, steps=3).validated().replay_config()


def test_another_command_does_not_continue_an_unfinished_run(error_line, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    saved = TrlRunConfig(capacity=16, batch_size=12, rollouts_per_step=8, group_size=4)
    (out / "checkpoints" / "command.json").write_text(json.dumps(
        {"replay_theory_version": trl_run.__version__, "config": saved.__dict__}))
    before = sorted(p.name for p in out.rglob("*"))
    assert error_line("trl-replay", "--out", str(out), *BY_HAND, "--steps", "7") == (
        f"--out {out} holds an unfinished run with other options: --steps 40 (now 7); run its own command to "
        "continue it, or choose a new --out")
    (out / "run.json").write_text("{}")
    assert error_line("trl-replay", "--out", str(out), *BY_HAND) == (
        f"--out {out} holds a finished run (run.json); results are never overwritten: choose a new --out")
    assert sorted(p.name for p in out.rglob("*")) == before + ["run.json"]


def test_design_help_names_the_batch_size_as_the_readme_does(cli):
    # the design file comes from `optimal ... -B B --json` (the noise-scale rule fixes B); -R was the paper rule's
    code, out, _ = cli("trl-replay", "--help")
    assert code == 0 and "optimal ... -B B --json" in " ".join(out.split()) and "-R R" not in out


def test_the_runs_zero_share_is_trls_frac_reward_zero_std_averaged():
    history = [{"step": 1, "frac_reward_zero_std": 0.5}, {"step": 2}, {"step": 3, "frac_reward_zero_std": 0.25}]
    z = zero_share_of_history(history)
    assert z["value"] == 0.375 and z["generations"] == 2
    assert z["source"] == "trl-replay: TRL's frac_reward_zero_std, the mean over 2 logged generations"
    assert zero_share_of_history([{"step": 1}]) is None  # none logged: no record, not a 0
    assert zero_share_of_history([{"frac_reward_zero_std": 1.0}]) is None  # every group equal: prices nothing
