"""``optimal --framework``: advise/frameworks.py's lines checked by hand, against the installed TRL's GRPOConfig, and
against the key paths read from the other trainers' configs at their pinned versions (framework_keys.json: repo,
path, tag and commit of each)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from replay_theory.advise.frameworks import FRAMEWORKS, config_lines
from replay_theory.theory.designs import Design

FIXTURE = json.loads((Path(__file__).parent / "framework_keys.json").read_text())
ON_POLICY = Design.on_policy_at(256, group_size=8)
MINI = Design(64, 256, 256, group_size=8)  # one generation of 256 in 4 mini-batches of 64
REPLAY = Design(64, 256, 1024, group_size=8)  # a FIFO of 4 generations
CASES = [dict(design=ON_POLICY), dict(design=ON_POLICY, epochs=3), dict(design=MINI, mini_batches=4),
         dict(design=MINI, mini_batches=4, epochs=2), dict(design=ON_POLICY, max_staleness=1),
         dict(design=ON_POLICY, max_staleness=3), dict(design=MINI, mini_batches=4, max_staleness=2),
         dict(design=ON_POLICY, selective=True), dict(design=REPLAY)]


def lines(framework: str, **kw) -> dict[str, str]:
    answer = config_lines(framework, **kw)
    assert answer.refused is None, answer.refused
    return dict(line.replace(" ", "=", 1).split("=", 1) if "=" in line or " " in line else (line, "")
                for line in answer.lines)


def test_on_policy_by_hand():
    # TRL: B = 256 = 8 per device x 1 process x 32 accumulation steps; one generation of 256 per optimizer step
    assert lines("trl", design=ON_POLICY) == {"per_device_train_batch_size": "8", "gradient_accumulation_steps": "32",
                                              "num_generations": "8"}
    # verl counts prompts: 256 / 8 = 32 prompts of n = 8, one mini-batch of 32 prompts
    assert lines("verl", design=ON_POLICY) == {"data.train_batch_size": "32", "actor_rollout_ref.rollout.n": "8",
                                               "actor_rollout_ref.actor.ppo_mini_batch_size": "32"}
    assert lines("openrlhf", design=ON_POLICY) == {"--rollout.batch_size": "32", "--rollout.n_samples_per_prompt": "8",
                                                   "--train.batch_size": "256"}
    assert lines("skyrl", design=ON_POLICY)["trainer.policy_mini_batch_size"] == "32"
    assert lines("areal", design=ON_POLICY)["actor.ppo_n_minibatches"] == "1"  # its default is 4
    assert lines("prime-rl", design=ON_POLICY) == {"orchestrator.batch_size": "256", "orchestrator.group_size": "8",
                                                   "orchestrator.max_off_policy_steps": "0"}
    assert lines("trl", design=ON_POLICY, processes=4)["gradient_accumulation_steps"] == "8"  # 8 x 4 x 8 = 256


def test_replay_is_refused_everywhere_and_names_our_trainer():
    for framework in FRAMEWORKS:
        refused = config_lines(framework, REPLAY).refused
        assert refused is not None and "N = 1024 > R = 256" in refused
        assert "replay-theory trl-replay --batch-size 64 --rollouts-per-step 256 --capacity 1024" in refused
        assert "\n" not in refused


def test_epochs_and_mini_batches():
    assert lines("trl", design=ON_POLICY, epochs=3)["num_iterations"] == "3"
    assert lines("verl", design=ON_POLICY, epochs=3)["actor_rollout_ref.actor.ppo_epochs"] == "3"
    assert lines("skyrl", design=ON_POLICY, epochs=3)["trainer.update_epochs_per_batch"] == "3"
    assert lines("openrlhf", design=ON_POLICY, epochs=3)["--train.max_epochs"] == "3"
    mini = lines("trl", design=MINI, mini_batches=4)  # B = 64 = 8 x 8; 4 optimizer steps per generation of 256
    assert (mini["gradient_accumulation_steps"], mini["steps_per_generation"]) == ("8", "32")
    assert lines("verl", design=MINI, mini_batches=4)["actor_rollout_ref.actor.ppo_mini_batch_size"] == "8"
    for framework in ("nemo-rl", "slime", "areal", "prime-rl"):  # one pass over a generation
        assert "epochs" in config_lines(framework, ON_POLICY, epochs=2).refused
    assert "mini-batches over a generation" in config_lines("prime-rl", MINI, mini_batches=4).refused
    assert "mini_batches = 4" in config_lines("verl", MINI).refused  # B x 1 != R: says which m would fit


def test_trl_lines_make_the_design_in_grpoconfig(tmp_path):
    trl = pytest.importorskip("trl")
    for kw, updates in ((dict(design=ON_POLICY), 1), (dict(design=MINI, mini_batches=4, epochs=2), 8)):
        answer = config_lines("trl", **kw)
        values = {key: int(value) for key, value in (line.split("=") for line in answer.lines)}
        config = trl.GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, **values)
        design = kw["design"]
        assert config.generation_batch_size == design.rollouts_per_step  # R fresh per generation
        assert config.per_device_train_batch_size * config.gradient_accumulation_steps == design.batch_size  # B
        assert config.steps_per_generation // config.gradient_accumulation_steps * config.num_iterations == updates


def test_staleness_keys():
    assert lines("verl", design=ON_POLICY, max_staleness=2)["trainer.v1.sampler.max_off_policy_threshold"] == "3"
    assert lines("skyrl", design=ON_POLICY, max_staleness=2)["trainer.fully_async.max_staleness_steps"] == "2"
    assert lines("nemo-rl", design=ON_POLICY, max_staleness=2)["grpo.async_grpo.max_trajectory_age_steps"] == "2"
    assert "train_async.py" in lines("slime", design=ON_POLICY, max_staleness=1)
    assert "one step off" in config_lines("slime", ON_POLICY, max_staleness=2).refused
    answer = config_lines("trl", ON_POLICY, max_staleness=2)
    assert answer.target == "AsyncGRPOConfig" and "max_staleness=2" in answer.lines


def test_bad_shapes_are_one_line():
    assert "R = 36 is not a multiple of G = 8" in config_lines("trl", Design.on_policy_at(36, group_size=8)).refused
    assert config_lines("skyrl", Design.on_policy_at(252, group_size=12)).refused is None  # 21 groups of 12
    refused = config_lines("verl", Design(20, 40, 40, group_size=8), mini_batches=2).refused
    assert "B = 20 must be a multiple of G = 8" in refused  # R = 40 is 5 groups, a mini-batch of 20 splits one
    assert "num_generations >= 2" in config_lines("trl", Design.on_policy_at(64)).refused
    with pytest.raises(ValueError, match="framework must be one of"):
        config_lines("ray", ON_POLICY)
    with pytest.raises(ValueError, match="epochs must be an integer >= 1"):
        config_lines("trl", ON_POLICY, epochs=0)


def every_key(framework: str) -> set[str]:
    keys = set()
    for kw in CASES:
        answer = config_lines(framework, **kw)
        keys |= {(answer.target, key) for key in answer.keys}
    return keys


def test_every_printed_key_is_a_trl_field():
    trl = pytest.importorskip("trl")
    from trl.experimental.async_grpo import AsyncGRPOConfig

    fields = {"GRPOConfig": {f.name for f in dataclasses.fields(trl.GRPOConfig)},
              "AsyncGRPOConfig": {f.name for f in dataclasses.fields(AsyncGRPOConfig)}}
    keys = every_key("trl")
    assert {key for _, key in keys} >= {"num_iterations", "steps_per_generation", "max_staleness"}
    for target, key in keys:
        assert key in fields[target], (target, key)


@pytest.mark.parametrize("framework", [name for name in FRAMEWORKS if name != "trl"])
def test_every_printed_key_was_read_in_the_pinned_config(framework):
    fixture = FIXTURE[framework]
    assert fixture["version"] == FRAMEWORKS[framework].version and fixture["repo"] == FRAMEWORKS[framework].repo
    printed = {key for _, key in every_key(framework)}
    assert printed and printed <= set(fixture["keys"]), printed - set(fixture["keys"])


def test_cli_framework_option(cli, optimal_profile):
    # a replay answer: SGD and a staleness table reaching age 63 (theory/guarded.py, issue 38)
    base = ("optimal", "--mu", "5.28", "-B", "512", "--profile", optimal_profile(100.0), "--kappa", "0.5",
            "--optimizer", "sgd", "--group-size", "8", "--latency-floor", "128")
    code, out, _ = cli(*base, "--json")
    assert code == 0 and "framework" not in json.loads(out)  # golden outputs unchanged without the option
    code, out, _ = cli(*base, "--json", "--framework", "verl")
    record = json.loads(out)
    assert record["framework"]["name"] == "verl" and "trl-replay" in record["framework"]["refused"]
    assert record["regime"] == "replay"
    code, text, _ = cli(*base, "--framework", "verl")
    assert text.rstrip().splitlines()[-1].startswith("verl 0.9.1: not config-only: a FIFO of N =")
    code, out, err = cli(*base, "--framework", "ray")
    assert code == 2 and out == "" and "--framework must be one of trl, verl, openrlhf" in err
