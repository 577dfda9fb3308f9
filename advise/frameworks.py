"""``optimal --framework K``: the config lines that realise a design in one RL trainer, or the one line saying why
only our TRL replay trainer can (docs/FRAMEWORKS.md cites each key's file and version).

Paper: experience-replay (docs/REFERENCES.md), Sec. 3. A ``Design`` (theory/designs.py) is B = ``batch_size``
(responses per update), R = ``rollouts_per_step`` (fresh responses per generation), N = ``capacity`` (FIFO size) and
G = ``group_size``. The trainers below express three families besides on-policy (N = R = B):

| argument        | symbol | family                                                                             |
|-----------------|--------|------------------------------------------------------------------------------------|
| ``mini_batches``| m      | one generation of R split into m updates of B = R / m (N = R)                       |
| ``epochs``      | e      | e passes over the generation: e m updates per generation                           |
| ``max_staleness``| k     | bounded staleness: each rollout used once, generated at most k weight versions ago |
| ``selective``   |        | drop the groups whose advantages are all zero (within a generation)                |

A FIFO that keeps rollouts across generations (N > R), or draws with replacement (B > R), is config-only nowhere:
``replay_theory.integrations.trl.ReplayGRPOTrainer`` (``replay-theory trl-replay``) is the trainer that does it.
Units differ: verl, SkyRL, OpenRLHF's rollout batch, slime's rollout batch, NeMo-RL's prompts per step and AReaL's
dataset batch count prompts (R / G); TRL, OpenRLHF's train batch, slime's global batch, NeMo-RL's global batch and
prime-rl count responses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ..theory.designs import Design

TRL_REPLAY = "replay_theory.integrations.trl.ReplayGRPOTrainer (replay-theory trl-replay)"


@dataclass(frozen=True)
class Framework:
    """One trainer at its pinned version: where its keys are defined (repo, file, tag or commit) and how its lines
    are written (``syntax``: ``kwargs`` Python keyword arguments, ``override`` Hydra/OmegaConf ``key=value``,
    ``cli`` command-line flags, ``toml`` dotted TOML keys)."""

    name: str
    version: str
    repo: str
    source: str
    syntax: str


FRAMEWORKS: dict[str, Framework] = {
    "trl": Framework("TRL", "1.16.0", "huggingface/trl", "trl/trainer/grpo_config.py (GRPOConfig), "
                     "trl/experimental/async_grpo/async_grpo_config.py (AsyncGRPOConfig)", "kwargs"),
    "verl": Framework("verl", "0.9.1", "verl-project/verl", "verl/trainer/config/_generated_ppo_trainer.yaml "
                      "(wheel verl-0.9.1)", "override"),
    "openrlhf": Framework("OpenRLHF", "v0.11.0", "OpenRLHF/OpenRLHF", "openrlhf/cli/train_ppo_ray.py", "cli"),
    "nemo-rl": Framework("NeMo-RL", "v0.7.0", "NVIDIA-NeMo/RL", "examples/configs/grpo_math_1B.yaml", "override"),
    "slime": Framework("slime", "v0.3.1", "THUDM/slime", "slime/utils/arguments.py, train_async.py", "cli"),
    "areal": Framework("AReaL", "v1.0.4", "inclusionAI/AReaL", "areal/api/cli_args.py", "override"),
    "skyrl": Framework("SkyRL", "skyrl-v0.3.0", "NovaSky-AI/SkyRL", "skyrl/train/config/config.py", "override"),
    "prime-rl": Framework("prime-rl", "v0.8.0", "PrimeIntellect-ai/prime-rl",
                          "packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py", "toml"),
}
"""The eight trainers ``--framework`` names, each at the version whose keys were read."""


@dataclass(frozen=True)
class FrameworkAnswer:
    """The lines to paste (``lines``, each ``key=value`` or a flag in the trainer's own syntax) with their notes, or
    ``refused``: one line saying why the trainer cannot express the design and what can."""

    framework: str
    version: str
    lines: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    refused: str | None = None
    target: str = ""
    """The class the lines are keyword arguments of (TRL: ``GRPOConfig``, or ``AsyncGRPOConfig`` with staleness)."""

    @property
    def keys(self) -> list[str]:
        """The key (or flag, or script) each line sets, as the trainer spells it."""
        return [line.split("=", 1)[0].split(" ", 1)[0] for line in self.lines]

    def text(self) -> str:
        """The answer as ``optimal`` prints it after its own text."""
        fw = FRAMEWORKS[self.framework]
        head = f"{fw.name} {fw.version}" + (f" {self.target}(...)" if self.target else "") + ":"
        if self.refused is not None:
            return f"{head} not config-only: {self.refused}"
        return "\n".join([head, *(f"  {line}" for line in self.lines), *(f"  # {note}" for note in self.notes)])

    def to_json(self) -> dict:
        """The record ``optimal --json`` adds under "framework"."""
        return {"name": self.framework, "version": self.version, "target": self.target or None,
                "lines": list(self.lines), "notes": list(self.notes), "refused": self.refused}


class _Refused(ValueError):
    """A design the trainer cannot express: the message is the one line ``FrameworkAnswer.refused`` holds."""


@dataclass(frozen=True)
class _Shape:
    """A design with its reuse arguments, checked once: G, B, R, m, e, k (k in weight versions)."""

    G: int
    B: int
    R: int
    m: int
    e: int
    k: int
    selective: bool

    @property
    def prompts(self) -> int:
        return self.R // self.G


def _shape(design: Design, epochs: int, mini_batches: int, max_staleness: int, selective: bool) -> _Shape:
    """The design as one generation of R split into m mini-batches of B, or the refusal every trainer shares."""
    for name, value, low in (("epochs", epochs, 1), ("mini_batches", mini_batches, 1),
                             ("max_staleness", max_staleness, 0)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    B, R, N, G = design.batch_size, design.rollouts_per_step, design.capacity, design.group_size
    replay = (f"; our {TRL_REPLAY} runs it: replay-theory trl-replay --batch-size {B} --rollouts-per-step {R} "
              f"--capacity {N} --group-size {G}" + (" --buffer selective" if selective or design.selective else ""))
    selective = selective or design.dynamic  # dynamic sampling ([E11]) is the trainers' filter
    if design.selective and not design.dynamic:  # optimal --zero-share's FIFO of admitted groups ([E8])
        raise _Refused(f"selective replay stores the groups with unequal rewards in a FIFO of N = {N} and draws "
                       f"B = {B} of them with replacement (docs/THEORY.md [E8]); a trainer's group filter (verl "
                       f"filter_groups, NeMo-RL dynamic sampling, SkyRL's filter) drops and regenerates within a "
                       f"generation and uses each group once, another design{replay}")
    if N > R:
        what = ("selective replay keeps groups across generations" if selective else
                f"a FIFO of N = {N} > R = {R} reuses rollouts across generations")
        raise _Refused(f"{what}, and no key of this trainer keeps rollouts past their own generation{replay}")
    if B > R:
        raise _Refused(f"B = {B} > R = {R} draws rollouts with replacement within a step, which no key of this "
                       f"trainer does{replay}")
    if R % G:
        raise _Refused(f"R = {R} is not a multiple of G = {G}: a generation holds whole groups of G completions")
    if B * mini_batches != R:
        hint = f" (mini_batches = {R // B})" if R % B == 0 else ""
        raise _Refused(f"B x mini_batches = {B} x {mini_batches} != R = {R}: a generation of R is split into "
                       f"mini_batches updates of B{hint}")
    return _Shape(G, B, R, mini_batches, epochs, max_staleness, selective)


def _no(feature: str, key_hint: str = "") -> _Refused:
    return _Refused(f"it has no key for {feature}{key_hint}")


def _in_prompts(s: _Shape, batch: str, samples: str, mini_batch: str) -> list[str]:
    """The lines of a trainer that counts its batch and mini-batch in prompts: R / G prompts of G samples a generation,
    B / G prompts an update (B in whole groups)."""
    if s.B % s.G:
        raise _Refused(f"its mini-batch counts prompts: B = {s.B} must be a multiple of G = {s.G}")
    return [f"{batch}={s.prompts}", f"{samples}={s.G}", f"{mini_batch}={s.B // s.G}"]


def _with_keys(s: _Shape, lines: list[str], notes: Sequence[str] = (), *, epochs: str = "", selective: str = "",
               stale: Sequence[str] = (), stale_note: str = "") -> tuple[list[str], list[str]]:
    """A trainer's ``lines`` and ``notes`` with the keys of what ``s`` asks for beyond one on-policy pass, in one
    order: ``epochs`` (e > 1), ``selective`` (zero-advantage groups dropped), then ``stale`` and its note (k > 0). A
    trainer without a key for one of them has refused it before."""
    lines = [*lines, *([epochs] if s.e > 1 else []), *([selective] if s.selective else []), *(stale if s.k else [])]
    return lines, [*notes, *([stale_note] if s.k else [])]


def _trl(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """TRL 1.16: an optimizer step is per_device_train_batch_size x processes x gradient_accumulation_steps
    completions; a generation is that times steps_per_generation / gradient_accumulation_steps (grpo_config.py
    __post_init__), reused num_iterations times."""
    if s.G < 2:
        raise _Refused(f"GRPOConfig needs num_generations >= 2 (advantages within a group), got G = {s.G}: give "
                       "--group-size")
    if s.B % processes:
        raise _Refused(f"B = {s.B} is not a multiple of processes = {processes}")
    per_device = math.gcd(s.B // processes, 8)  # TRL's default micro-batch 8, or the largest divisor below it
    accumulation = s.B // (processes * per_device)
    lines = [f"per_device_train_batch_size={per_device}", f"gradient_accumulation_steps={accumulation}",
             f"num_generations={s.G}"]
    notes = [f"B = {s.B} = {per_device} per device x {processes} processes x {accumulation} accumulation steps; "
             "per_device_train_batch_size is a memory choice, keep the product"]
    if s.k:
        if s.m > 1 or s.e > 1 or s.selective:
            raise _Refused("its asynchronous trainer (trl.experimental.async_grpo) has no steps_per_generation or "
                           "num_iterations: bounded staleness with reuse is not expressible")
        return ([*lines, f"max_staleness={s.k}"],
                notes + ["trl.experimental.async_grpo.AsyncGRPOTrainer drops samples older than max_staleness "
                         "weight updates"])
    if s.selective:  # dynamic sampling: each update on-policy, one pass (a filter with epochs: no trainer of ours)
        ours = (f"; our {TRL_REPLAY} runs it: replay-theory trl-replay --buffer dynamic --rollouts-per-step {s.B} "
                f"--group-size {s.G}" if s.m == 1 and s.e == 1 else "")
        raise _no("dropping zero-advantage groups", ours)
    if s.m > 1:
        lines.append(f"steps_per_generation={s.m * accumulation}")
        notes.append(f"generation_batch_size = {s.R} = R: {s.m} optimizer steps per generation")
    if s.e > 1:
        lines.append(f"num_iterations={s.e}")
    return lines, notes


def _verl(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """verl 0.9.1: train_batch_size and ppo_mini_batch_size count prompts; rollout.n multiplies them."""
    return _with_keys(
        s, _in_prompts(s, "data.train_batch_size", "actor_rollout_ref.rollout.n",
                       "actor_rollout_ref.actor.ppo_mini_batch_size"),
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is a memory choice"],
        epochs=f"actor_rollout_ref.actor.ppo_epochs={s.e}", selective="algorithm.filter_groups.enable=true",
        stale=["trainer.v1.trainer_mode=separate_async", f"trainer.v1.separate_async.parameter_sync_step={s.m}",
               f"trainer.v1.sampler.max_off_policy_threshold={s.k + 1}"],
        stale_note="the threshold counts the weight versions a trajectory spans (age k spans k + 1, "
                   "trainer/ppo/v1/replay_buffer.py); separate_async needs train_batch_size = parameter_sync_step x "
                   "ppo_mini_batch_size and rollout.nnodes / n_gpus_per_node set")


def _openrlhf(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """OpenRLHF v0.11.0: rollout.batch_size counts prompts, train.batch_size samples (train_ppo_ray.py)."""
    if s.selective:
        raise _no("dropping zero-advantage groups (not checked at this version)")
    return _with_keys(
        s, [f"--rollout.batch_size {s.prompts}", f"--rollout.n_samples_per_prompt {s.G}", f"--train.batch_size {s.B}"],
        epochs=f"--train.max_epochs {s.e}", stale=["--train.async_enable", f"--train.async_queue_size {s.k}"],
        stale_note="the sampler runs at most async_queue_size generations ahead (ppo_trainer_async.py)")


def _nemo_rl(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """NeMo-RL v0.7.0: num_prompts_per_step prompts of num_generations_per_prompt, policy.train_global_batch_size
    samples per update; one pass over each generation."""
    if s.e > 1:
        raise _no("epochs over a generation (each generation is trained in one pass)")
    return _with_keys(
        s, [f"grpo.num_prompts_per_step={s.prompts}", f"grpo.num_generations_per_prompt={s.G}",
            f"policy.train_global_batch_size={s.B}"],
        selective="grpo.use_dynamic_sampling=true",
        stale=["grpo.async_grpo.enabled=true", f"grpo.async_grpo.max_trajectory_age_steps={s.k}",
               "loss_fn.use_importance_sampling_correction=true"],
        stale_note="async GRPO requires the importance-sampling correction (grpo_math_1B.yaml)")


def _slime(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """slime v0.3.1: --rollout-batch-size prompts, --global-batch-size samples; train_async.py is one step off."""
    if s.e > 1:
        raise _no("epochs over a generation (--num-epoch counts passes over the dataset)")
    if s.selective:
        raise _no("dropping zero-advantage groups (not checked at this version)")
    if s.k > 1:
        raise _Refused(f"its asynchronous loop (train_async.py) is one step off: max_staleness = {s.k} > 1 has no key")
    lines = [f"--rollout-batch-size {s.prompts}", f"--n-samples-per-prompt {s.G}", f"--global-batch-size {s.B}"]
    if s.k == 1:
        lines.append("train_async.py")
        return lines, ["run train_async.py instead of train.py: generation of the next rollout overlaps training"]
    return lines, []


def _areal(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """AReaL v1.0.4: train_dataset.batch_size prompts of gconfig.n_samples, split into actor.ppo_n_minibatches."""
    if s.e > 1:
        raise _no("epochs over a generation (ppo_n_minibatches is one pass)")
    if s.selective:
        raise _no("dropping zero-advantage groups (not checked at this version)")
    lines = [f"train_dataset.batch_size={s.prompts}", f"gconfig.n_samples={s.G}", f"actor.ppo_n_minibatches={s.m}",
             f"rollout.max_head_offpolicyness={s.k}"]
    notes = ["ppo_n_minibatches defaults to 4: set it even on-policy"]
    if s.k:
        lines.append("actor.use_decoupled_loss=true")
        notes.append("decoupled PPO corrects for the behaviour policy of stale rollouts")
    return lines, notes


def _skyrl(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """SkyRL skyrl-v0.3.0: train_batch_size and policy_mini_batch_size count prompts (utils.validate_batch_sizes)."""
    return _with_keys(
        s, _in_prompts(s, "trainer.train_batch_size", "generator.n_samples_per_prompt",
                       "trainer.policy_mini_batch_size"),
        epochs=f"trainer.update_epochs_per_batch={s.e}", selective="trainer.algorithm.dynamic_sampling.type=filter",
        stale=["trainer.fully_async.enabled=true", f"trainer.fully_async.max_staleness_steps={s.k}"],
        stale_note="a group scheduled at step i is trained at step j <= i + max_staleness_steps")


def _prime_rl(s: _Shape, processes: int) -> tuple[list[str], list[str]]:
    """prime-rl v0.8.0: one update per step on orchestrator.batch_size samples; max_off_policy_steps bounds age."""
    if s.m > 1 or s.e > 1:
        raise _no("epochs or mini-batches over a generation (one update of batch_size samples per step)")
    if s.selective:
        raise _no("dropping zero-advantage groups as one key (orchestrator.pre_batch_filters is a list)")
    return ([f"orchestrator.batch_size={s.B}", f"orchestrator.group_size={s.G}",
             f"orchestrator.max_off_policy_steps={s.k}"],
            ["max_off_policy_steps defaults to 8 (asynchronous): 0 keeps every rollout on-policy"])


BUILDERS: dict[str, Callable[[_Shape, int], tuple[list[str], list[str]]]] = {
    "trl": _trl, "verl": _verl, "openrlhf": _openrlhf, "nemo-rl": _nemo_rl, "slime": _slime, "areal": _areal,
    "skyrl": _skyrl, "prime-rl": _prime_rl}


def config_lines(framework: str, design: Design, *, epochs: int = 1, mini_batches: int = 1, max_staleness: int = 0,
                 selective: bool = False, processes: int = 1) -> FrameworkAnswer:
    """The lines that realise ``design`` in ``framework`` (a key of ``FRAMEWORKS``), or the one-line reason it
    cannot: e epochs over m mini-batches of one generation, rollouts at most ``max_staleness`` weight versions old,
    zero-advantage groups dropped when ``selective``; ``processes`` (TRL's data-parallel ranks) splits B."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if not (isinstance(processes, int) and processes >= 1):
        raise ValueError(f"processes must be an integer >= 1, got {processes!r}")
    version = FRAMEWORKS[framework].version
    try:
        shape = _shape(design, epochs, mini_batches, max_staleness, selective)
        lines, notes = BUILDERS[framework](shape, processes)
    except _Refused as why:
        return FrameworkAnswer(framework, version, refused=str(why))
    target = ("AsyncGRPOConfig" if max_staleness else "GRPOConfig") if framework == "trl" else ""
    return FrameworkAnswer(framework, version, tuple(lines), tuple(notes), target=target)
