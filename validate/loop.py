"""The calibrate -> predict -> verify loop of issue 4 on a language model.

Paper: experience-replay (docs/REFERENCES.md): Thm 3.5's design
(x*, y*) from a measured profile and mu, checked against designs trained at equal compute.

``replay-theory validate calibrate-model --tiny --out DIR`` builds (or loads) the policy, warm-starts it by
SFT on solver solutions, measures mu (timing and App. E counts), sigma^2(s), rho and the KL drift on a
probe RL run, and writes ``DIR/calibration.json`` and ``DIR/profile.json``. ``replay-theory validate
predict --out DIR`` turns them into the Thm 3.5 design (x*, y*) and integer N, B, R in
``DIR/predicted.json``; ``verify`` trains the designs at equal compute (on-policy, the prediction and FIFO
buffers around it with GRPO; RLOO whole-group replay cells (rho, L, c); ``validate/families.py``) and writes
``DIR/report.json/.md/.png`` (``validate/report.py``). N, B, R are DesignConfig's ``capacity``, ``batch_size``,
``rollouts_per_step`` in every file; one saved before says N, B, R and is read through ``core.designs.in_design_names``.
Files are never overwritten: a step whose output exists is skipped (resume) when it was made with the
same settings, and refused otherwise; ``--out`` is checked before any work (``check_run_dir``). verify's runs
(design x learning rate x seed) are independent and each fixes its own seeds: ``--jobs`` trains them in worker
processes (``core/jobs.py``) and ``--batched`` a design's seeds as one model (``validate/batched.py``), both writing
the records the one-run-at-a-time loop writes.

Rollouts come from the engine chosen by ``ValidateConfig.engine`` (``validate/engines.py``): the HF
loop, or vLLM on a GPU started from ``DIR/warm_start``. One engine per process and run directory
(``get_sampler``), so ``validate all`` starts vLLM once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import transformers

from ..advise.profile_files import load_profile, next_optimal_line
from ..core.designs import in_design_names
from ..core.jobs import local_workers, run_unordered
from ..core.progress import ProgressBar
from ..outputs import write_new
from ..theory.design import DesignQuery, optimal_design
from ..theory.forgetting import forgetting_pick
from ..theory.noise_scale import noise_scale_pick
from . import countdown
from .batched import stack_policy
from .calibrate import calibrate_lm, write_calibration
from .config import (
    FIXED_B_FAMILIES,
    REUSE_EPOCHS,
    SFT_BATCH_SIZE,
    SFT_LR,
    TINY_MODEL,
    VERIFY_BUDGET_UPDATES,
    VERIFY_SEEDS,
    ValidateConfig,
    VerifyConfig,
    check_run_dir,
    load_run_config,
    report_stem,
)
from .engines import Sampler, make_sampler, resolve_engine
from .families import (
    NamedDesign,
    fixed_b_designs,
    horizon_designs,
    neighbour_designs,
    reuse_designs,
    steps_at_budget,
)
from .policy import (
    ModelConfig,
    load_checkpoint,
    load_policy,
    resolve_device,
    save_checkpoint,
)
from .report import best_lr_row, mean_sd, prediction_rows, write_report
from .rl import (
    RLConfig,
    checkpoint_next_step,
    evaluate_policies,
    evaluate_policy,
    train,
    train_loop,
)
from .sft import sft_warm_start
from .steplog import StepLog, truncate_log
from .verdict import compare

__all__ = ["TINY_MODEL", "VERIFY_BUDGET_UPDATES", "VERIFY_SEEDS", "ValidateConfig", "VerifyConfig", "check_run_dir",
           "configure_torch", "load_run_config", "run_calibrate", "run_predict", "run_verify"]

BOOTSTRAP_DRAWS = 2000
INTERVAL_LEVEL = 0.9


def configure_torch(threads: int) -> None:
    """``threads`` intra-op CPU threads and deterministic kernels, before any work.

    Why a set count: torch's default (one thread per core) oversubscribes a machine shared with other
    jobs; on a 2-core machine with one other CPU-bound process a second thread slows the tiny model
    (bench/bench_validate_threads.py measures it). Results do not depend on the count
    (tests/integration/test_validate_determinism.py runs a calibration at 1 and 2 threads in separate processes).
    """
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    transformers.utils.logging.disable_progress_bar()  # one bar per checkpoint load; ours show the run's progress


_SAMPLERS: dict = {}  # one rollout engine per (engine, run directory, settings) and process


def check_engine(config: ValidateConfig) -> str:
    """The resolved engine name; bad --engine / --device combinations fail here, before any work."""
    if config.sync_every < 1:
        raise ValueError(f"--sync-every must be >= 1, got {config.sync_every}")
    if config.micro_batch_size < 0:
        raise ValueError(f"--micro-batch must be >= 0 (0: whole batch), got {config.micro_batch_size}")
    engine = resolve_engine(config.engine, config.device)
    resolve_device(config.device)  # CUDA without a GPU fails here too, for every engine
    return engine


def get_sampler(config: ValidateConfig, out_dir: Path):
    """The run's rollout engine, built once per process (vLLM starts from DIR/warm_start)."""
    engine = check_engine(config)
    key = (engine, str(Path(out_dir).resolve()), config.device, config.sync_every, config.gpu_memory_utilization,
           config.decode)
    if key not in _SAMPLERS:
        _SAMPLERS[key] = make_sampler(engine, device=config.device, sync_every=config.sync_every,
                                      model_path=str(Path(out_dir) / "warm_start"), seed=config.seed,
                                      gpu_memory_utilization=config.gpu_memory_utilization, decode=config.decode)
    return _SAMPLERS[key]


def prepare_policy(config: ValidateConfig, out_dir: Path, train_set, progress: bool = False):
    """The warm-started policy: loaded from DIR/warm_start if present, else built (+ SFT for tiny) and saved."""

    checkpoint = out_dir / "warm_start"  # created only once the policy loaded: bad input leaves nothing behind
    if checkpoint.exists():
        return load_checkpoint(checkpoint, device=config.device), None
    if config.model == "tiny":
        policy = load_policy(ModelConfig(device=config.device, seed=config.seed, **TINY_MODEL), countdown.ALPHABET)
        examples = [(p.prompt_text(), countdown.solution(p)) for p in train_set]
        bar = ProgressBar("warm start (SFT steps)", config.sft_steps, enabled=progress)
        losses = sft_warm_start(policy, examples, steps=config.sft_steps, batch_size=SFT_BATCH_SIZE, lr=SFT_LR,
                                generator=torch.Generator().manual_seed(config.seed),
                                on_step=lambda step, loss: bar.advance())
        bar.close()
    else:
        policy, losses = load_policy(ModelConfig(source=config.model, device=config.device, seed=config.seed)), None
    save_checkpoint(policy, checkpoint)
    return policy, losses


def run_calibrate(config: ValidateConfig, out_dir: Path, log=print, progress: bool = False) -> dict:
    """Warm start, evaluate, probe, measure; writes calibration.json + profile.json (skipped if present).

    Every option is checked (``config.validated()``, the engine and device) before any work or file.
    ``progress``: bars with an ETA on stderr for the warm start, the probe and the measurements.
    """
    config = config.validated()
    check_run_dir(out_dir)
    if (out_dir / "calibration.json").exists():
        log(f"calibration exists in {out_dir}; skipping (delete it to measure again)")
        return json.loads((out_dir / "calibration.json").read_text())
    engine = check_engine(config)  # bad --engine/--device: one line, before any work
    configure_torch(config.threads)
    started = time.perf_counter()
    train_set, test_set = config.problems()
    policy, sft_losses = prepare_policy(config, out_dir, train_set, progress)
    sampler = get_sampler(config, out_dir)
    warm = evaluate_policy(policy, test_set, 8, 1.0, config.max_new_tokens, seed=config.seed + 1, sampler=sampler)
    log(f"warm start: held-out pass@1 {warm['pass@1']:.3f}, mean reward {warm['mean_reward']:.3f} ({engine} engine)")
    probe = RLConfig(steps=config.probe_steps, rollouts_per_step=config.rollouts_per_step,
                     group_size=config.group_size, batch_size=config.rollouts_per_step,
                     capacity=2 * config.rollouts_per_step, lr=config.lr, max_new_tokens=config.max_new_tokens,
                     sync_every=config.sync_every, micro_batch_size=config.micro_batch_size, seed=config.seed)
    bars: dict[str, ProgressBar] = {}

    def on_phase(phase: str, done: int, total: int) -> None:
        if phase not in bars:
            for bar in bars.values():
                bar.close()
            bars[phase] = ProgressBar(phase, total, 0, enabled=progress)
        bars[phase].update(done)

    calibration = calibrate_lm(policy, train_set, probe, samples=config.samples, seed=config.seed, sampler=sampler,
                               mu_window_seconds=config.mu_window_seconds, on_phase=on_phase)
    for bar in bars.values():
        bar.close()
    write_calibration(calibration, out_dir, source=f"replay-theory validate calibrate {dataclasses.asdict(config)}")
    summary = {"mu_measured": calibration.mu_timing, "mu_count": calibration.mu_count,
               "count_window": calibration.count_window, "engine": engine, "warm_start": warm,
               "sft_final_loss": sft_losses[-1] if sft_losses else None,
               "seconds": time.perf_counter() - started, "config": dataclasses.asdict(config)}
    with (out_dir / "calibration_summary.json").open("x") as handle:
        json.dump(summary, handle, indent=1, default=float)
    log(f"mu (generation / update time per completion) = {calibration.mu_timing:.3g}; "
        f"mu (App. E counts in a {config.mu_window_seconds:g} s window) = {calibration.mu_count:.3g}; "
        f"KL drift per step = {calibration.kl_drift_per_step:.3g}; rho = {calibration.rho:.3g}")
    return json.loads((out_dir / "calibration.json").read_text())


def calibrate_next_line(config: ValidateConfig, out_dir: Path) -> str:
    """The ``next:`` line calibrate-model prints last: the optimal command that reads its profile, runnable as printed
    (--mu is --price-mu, the price the predictions use: the timing mu varies from run to run and machine to machine)."""
    return next_optimal_line(out_dir / "profile.json", config.price_mu,
                             json.loads((out_dir / "profile.json").read_text()))


def run_predict(config: ValidateConfig, out_dir: Path, log=print, rho: float | None = None) -> dict:
    """Thm 3.5 from the measured profile, compute priced at ``config.price_mu``: predicted.json with x*, y*, N, B, R.

    ``rho`` overrides the profile's. An out-of-range fit is never clamped into [0, 1]: without ``rho``,
    rho = 0 is used and said (in the log and in predicted.json), because the simulator's exact-gradient
    calibration measures no correlation between groups and the LM's uncentred fit carries the stale bias.
    """
    check_run_dir(out_dir, needs="calibration.json")
    config = config.validated(memory=False)  # predict trains nothing: calibrate's sizes are not its memory
    if rho is not None and not 0.0 <= rho <= 1.0:
        raise ValueError(f"--rho must be in [0, 1], got {rho}")
    calibration = json.loads((out_dir / "calibration.json").read_text())
    mu_value = config.price_mu
    loaded = load_profile(out_dir / "profile.json")
    rho_note = None
    if rho is None:
        try:
            rho, rho_note = loaded.rho_for_design()
        except ValueError as err:
            rho, rho_note = 0.0, (f"rho = 0 used: {err.args[0].removesuffix('; give rho explicitly')}; the simulator's "
                                  "exact-gradient calibration measures no correlation between groups; pass --rho to "
                                  "choose")
    if rho_note:
        log(f"note: {rho_note}")
    design = optimal_design(DesignQuery(mu=mu_value, profile=loaded.profile, profile_rho=rho,
                                        profile_description=loaded.description,
                                        rollouts_per_step=config.rollouts_per_step))
    predicted = {"mu": mu_value, "mu_timing": calibration["mu_timing"], "x_star": design.x_star,
                 "y_star": design.y_star, "regime": design.regime,
                 "regime_text": design.regime_text, "advice": design.advice,
                 "capacity": design.capacity, "batch_size": design.batch_size,
                 "rollouts_per_step": design.rollouts_per_step,
                 "workers_per_trainer": design.workers_per_trainer, "rho_used": rho, "rho_note": rho_note,
                 "design": design.to_json_dict()}
    path = out_dir / "predicted.json"
    if path.exists():
        saved = load_predicted(out_dir)
        if any(saved.get(k) != predicted[k] for k in ("mu", "capacity", "batch_size", "rollouts_per_step")):
            raise ValueError(f"{path} exists with mu = {saved.get('mu', math.nan):.4g}, N = {saved['capacity']}, "
                             f"B = {saved['batch_size']}, R = {saved['rollouts_per_step']}; predictions are never "
                             f"overwritten: use another --out (or another --price-mu)")
        predicted = saved
    else:
        write_new(path, lambda tmp: tmp.write_text(json.dumps(predicted, indent=1, default=lambda v: None)))
    log(f"predicted (Thm 3.5's J, the large-budget limit, compute priced at mu = {mu_value:g}; this machine's timing "
        f"mu = {calibration['mu_timing']:.3g}): regime {design.regime}, x* = {design.x_star:.3g}, "
        f"y* = {design.y_star:.3g}, N = {design.capacity}, B = {design.batch_size}, R = {design.rollouts_per_step}")
    log(f"what it is: {design.regime_text}")  # never "replay" for gamma > 1 (theory/design.py::classify_regime)
    log(f"what to do: {design.advice}")
    if design.constraint:
        log(f"constraint: {design.constraint}")
    return predicted


def load_predicted(out_dir: Path) -> dict:
    """predicted.json with N, B, R under DesignConfig's names; one saved before says N, B, R (``in_design_names``)."""
    return in_design_names(json.loads((out_dir / "predicted.json").read_text()))


def _run_file_stem(name: str) -> str:
    return name.replace("=", "").replace(", ", "_").replace(" ", "").replace("/", "over")


@dataclasses.dataclass(frozen=True)
class VerifyRun:
    """What every step of one verify reads: its settings, the price of a rollout and how seeds are trained."""

    config: ValidateConfig
    plan: VerifyConfig
    out_dir: Path
    mu: float  # the prediction's mu: a rollout costs mu sample-updates
    batched: bool  # seeds as a batch axis (validate/batched.py): --batched with the HF engine
    lrs: tuple[float, ...]  # every design trains at each of these learning rates

    @property
    def R(self) -> int:
        return self.config.rollouts_per_step

    @property
    def K(self) -> int:
        return self.config.group_size

    @property
    def budget(self) -> float:
        """The on-policy run's compute, sample-update units (one sample's update = 1)."""
        return self.plan.budget_updates * (self.mu * self.R + self.R)

    @property
    def grid(self) -> bool:
        return len(self.lrs) > 1


@dataclasses.dataclass(frozen=True)
class Trainer:
    """What each verify run trains and is evaluated with, built once a process from the run's config (by
    ``run_verify``, or a ``--jobs`` worker): the warm start, the problems, the rollout engine and ``settings``, the RL
    settings every design shares (its learning rate, completion length, syncs, micro-batches and seed; ``_rl_config``
    puts a design in them). Seed s of every design trains with seed ``settings.seed + 101 s`` and is evaluated with
    ``settings.seed + 1 + s``."""

    warm_start: Path  # the checkpoint every run starts from
    device: str
    settings: RLConfig
    mu: float  # the prediction's mu: a rollout costs mu sample-updates
    train_set: list
    test_set: list
    sampler: Sampler

    @property
    def max_new_tokens(self) -> int:
        return self.settings.max_new_tokens

    def train_seed(self, s: int) -> int:
        return self.settings.seed + 101 * s

    def eval_seed(self, s: int) -> int:
        return self.settings.seed + 1 + s


def verify_settings(config: ValidateConfig) -> RLConfig:
    """The RL settings every verify run shares, read from the run's config (a design and its steps come per run)."""
    return RLConfig(lr=config.lr, max_new_tokens=config.max_new_tokens, sync_every=config.sync_every,
                    micro_batch_size=config.micro_batch_size, seed=config.seed)


def _rl_config(settings: RLConfig, design: NamedDesign, steps: int, lr: float, seed: int) -> RLConfig:
    """The RL run of ``design`` in verify: its design as it is, ``steps`` updates at learning rate ``lr`` and ``seed``,
    the run's generation ``settings`` (``verify_settings``)."""
    return dataclasses.replace(settings, **dataclasses.asdict(design.config), steps=steps, lr=lr, seed=seed)


def run_verify(config: ValidateConfig, out_dir: Path, plan: VerifyConfig | None = None, log=print,
               progress: bool = False, figure=None) -> dict:
    """Train each design from the same warm start at EQUAL compute and compare held-out reward; report.json/.md.

    Compute is priced at the prediction's mu (``config.price_mu`` when predicted): a rollout costs mu
    sample-updates. Seed s of every design trains with seed ``config.seed + 101 s`` and is evaluated with
    evaluation seed ``config.seed + 1 + s``; the warm start is evaluated with the same evaluation seeds.
    The verdict (``validate/verdict.py``): the prediction's rank among the FIFO designs the theory ranks
    and among all, its regret (reward gap to the best at equal compute) with a paired seed-bootstrap
    interval, and per neighbour the paired difference, its standard error and the seeds a 2-se
    separation would need. ``figure(report, path)`` draws report.png (the CLI passes
    ``figures.results.save_report_figure``); None: no figure.

    The steps: the saved report if there is one (``saved_report``), the warm start's evaluation, the designs and
    each rule's pick (``verify_designs``), the runs still to train (``pending_units``), training them
    (``train_units``), the rows and verdicts (``verify_report``) and the files (``write_report``).
    """
    plan = (plan or VerifyConfig()).validated()
    config = config.validated(memory=False)
    lrs = plan.learning_rates(config.lr)
    plan.check_sizes(config.rollouts_per_step, config.group_size)
    plan.check_verify_memory(config)  # verify's own: its workers, seeds and runs
    check_run_dir(out_dir, needs="predicted.json")
    stem = report_stem(plan.family)
    saved = saved_report(out_dir, stem, plan, lrs, config.lr, log)
    if saved is not None:
        return saved
    engine = check_engine(config)
    if engine == "vllm" and plan.jobs != 1:
        raise ValueError(f"--jobs must be 1 with --engine vllm (one engine holds its GPU memory share), got "
                         f"{plan.jobs}")
    configure_torch(config.threads)
    started = time.perf_counter()
    predicted = load_predicted(out_dir)
    calibration = json.loads((out_dir / "calibration.json").read_text())
    train_set, test_set = config.problems()
    trainer = Trainer(out_dir / "warm_start", config.device, verify_settings(config), predicted["mu"], train_set,
                      test_set, get_sampler(config, out_dir))
    run = VerifyRun(config, plan, out_dir, predicted["mu"], plan.batched and engine == "hf", lrs)
    (out_dir / "verify").mkdir(exist_ok=True)
    warm_evals = evaluate_warm_start(trainer, plan.seeds, run.batched)
    warm_mean, warm_sd = mean_sd([e["mean_reward"] for e in warm_evals])
    log(f"warm start: held-out reward {warm_mean:.3f} +- {warm_sd:.3f} over {plan.seeds} evaluation seeds")
    designs, centres, rules = verify_designs(run, predicted, calibration, log)
    paths, units = pending_units(run, designs)
    records = train_units(run, trainer, units, paths, log, progress)
    report = verify_report(run, designs, centres, rules, records, warm_evals, predicted, calibration, started)
    write_report(report, out_dir, stem, figure)
    return report


def saved_report(out_dir: Path, stem: str, plan: VerifyConfig, lrs: tuple[float, ...], lr: float,
                 log=print) -> dict | None:
    """``out_dir/stem.json`` when it was made with these seeds, budget and learning rates (``lrs``); None when there is
    none. ``lr``: the run's --lr, the rate of a report saved before learning-rate grids, which names none.

    Reports are never overwritten: the same request returns the saved report, another is refused."""
    path = out_dir / f"{stem}.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    saved_lrs = report["budget"].get("lr_grid", [report.get("config", {}).get("lr", lr)])
    if (report["budget"]["seeds"], report["budget"]["updates"], saved_lrs) != (
            plan.seeds, plan.budget_updates, list(lrs)):
        lr_text = f" at learning rates {', '.join(f'{lr:.3g}' for lr in saved_lrs)}" if len(saved_lrs) > 1 else ""
        raise ValueError(f"{path} exists for --seeds {report['budget']['seeds']} --budget-updates "
                         f"{report['budget']['updates']}{lr_text}; reports are never overwritten: use another "
                         f"--out")
    log(f"report exists in {out_dir}; not trained again (a new --out runs verify afresh)")
    return report


def evaluate_warm_start(trainer: Trainer, seeds: int, batched: bool) -> list[dict]:
    """The warm start's held-out evaluation at each of the ``seeds`` runs' evaluation seeds ``config.seed + 1 + s``;
    ``batched``: all of them as one seed-stacked model."""
    warm = load_checkpoint(trainer.warm_start, device=trainer.device)
    eval_seeds = [trainer.eval_seed(s) for s in range(seeds)]
    if batched and seeds > 1:
        return evaluate_policies(stack_policy(warm, seeds), trainer.test_set, 8, 1.0, trainer.max_new_tokens,
                                 eval_seeds, sampler=trainer.sampler)
    return [evaluate_policy(warm, trainer.test_set, 8, 1.0, trainer.max_new_tokens, seed=e, sampler=trainer.sampler)
            for e in eval_seeds]


def verify_designs(run: VerifyRun, predicted: dict, calibration: dict, log=print
                   ) -> tuple[list[NamedDesign], dict, dict]:
    """The designs verify trains, which of them each rule picked, and the rules' inputs.

    The neighbours family has the paper's prediction alone; fixed-b and horizon add the noise-scale rule's pick
    (from the calibration's B_noise) and the forgetting-aware rule's (B_noise and kappa, ``forgetting_memory``).
    ``rules``: ``pick``, ``noise_record``, ``memory``, ``forgetting`` (None where a rule made no prediction).
    """
    rules = {"pick": None, "noise_record": calibration.get("noise_scale") or {}, "memory": None, "forgetting": None,
             "optimal": None}
    if run.plan.family not in FIXED_B_FAMILIES:
        return neighbour_designs(run.config, predicted, run.plan.group_replay), {}, rules
    b_noise = rules["noise_record"].get("b_noise")
    if b_noise is not None:
        rules["pick"] = noise_scale_pick(b_noise, run.R, run.K, run.mu)
    else:
        log("note: calibration.json has no measured B_noise (no gradient signal, or calibrated before it was "
            "measured): the noise-scale rule makes no prediction; the family is trained without it")
    memory = rules["memory"] = forgetting_memory(run.out_dir, run.plan.kappa, log)
    if memory.get("kappa") is not None and b_noise is not None:
        rules["forgetting"] = forgetting_pick(b_noise, run.R, run.K, run.mu, memory["kappa"], memory["optimizer"],
                                              memory["beta1"], pilot_batch=memory.get("pilot_batch"),
                                              staleness=staleness_of_calibration(calibration))
    elif memory.get("kappa") is not None:
        memory["reason"] = "no measured B_noise"
    designs, centres = fixed_b_designs(run.config, predicted, rules["pick"], run.plan.group_replay,
                                       rules["forgetting"])
    if run.plan.family == "horizon":
        designs = horizon_designs(run.config, designs)
    if run.plan.family == "reuse":
        rules["optimal"] = optimal_answer(run, rules, calibration)
        designs, name = reuse_designs(run.config, designs, rules["optimal"] and rules["optimal"]["design"])
        if name is not None:
            centres["optimal"] = name
    return designs, centres, rules


def optimal_answer(run: VerifyRun, rules: dict, calibration: dict) -> dict | None:
    """``optimal``'s rule (``advise.advice``, the guarded answer it prints) on this run's inputs: B_noise, the memory
    record, the calibration's drift 1 + 2 KL(s) as the staleness cost (``optimal --profile`` reads the profile's
    sigma^2(s) table instead; docs/VALIDATION.md compares the two), mu, B = --rollouts-per-step, its groups, epochs up
    to max(REUSE_EPOCHS). Its record's essentials and the design (``theory.designs.Design``); None without B_noise or
    kappa."""
    from ..advise import advice
    from ..theory.designs import Design

    b_noise, memory = rules["noise_record"].get("b_noise"), rules["memory"] or {}
    if b_noise is None or memory.get("kappa") is None:
        return None
    pilot = memory.get("pilot_batch")
    query = advice.Query(mu=run.mu, batch_size=run.R, b_noise=float(b_noise), b_noise_source="calibration.json",
                         kappa=float(memory["kappa"]), kappa_source=str(memory.get("source", "")),
                         optimizer=memory["optimizer"], beta1=float(memory["beta1"]),
                         pilot_batch=None if pilot is None else int(pilot), group_size=run.K,
                         max_epochs=max(REUSE_EPOCHS), staleness=staleness_of_calibration(calibration))
    record = advice.advise(query)
    B, R, N = record["batch_size"], record["rollouts_per_step"], record["capacity"]
    design = {"on-policy": lambda: Design.on_policy_at(B, run.K),
              "epochs": lambda: Design.epochs_of(R, record["epochs"], record["mini_batches"], run.K),
              "replay": lambda: Design(B, R, N, group_size=run.K)}[record["regime"]]()
    return {"design": design, "regime": record["regime"], "what_to_do": record["what_to_do"],
            "batch_size": B, "rollouts_per_step": R, "capacity": N, "guard_moved": record["guard"]["moved"]}


def pending_units(run: VerifyRun, designs: list[NamedDesign]) -> tuple[dict, list[tuple]]:
    """Every (design, learning rate) cell's record paths, one a seed, and what is left to train: units
    (design, lr, steps, pending seeds), a cell's seeds together when batched. Saved records are kept (resume); one
    trained for another number of updates is refused."""
    cells = [(d, lr) for d in designs for lr in run.lrs]  # (design, learning rate): one group of seeds each
    tag = _lr_tag if run.grid else (lambda lr: "")
    paths = {(d.name, lr): [run.out_dir / "verify" / f"{_run_file_stem(d.name)}{tag(lr)}_seed{s}.json"
                               for s in range(run.plan.seeds)] for d, lr in cells}
    units = []  # what one process trains at a time: (design, lr, steps, pending seeds); a cell's seeds if batched
    for design, lr in cells:
        steps = steps_at_budget(design.config, run.budget, run.mu)
        for path in paths[(design.name, lr)]:
            if path.exists():  # resume: finished runs are kept
                saved = json.loads(path.read_text())
                if saved["steps"] != steps:
                    raise ValueError(f"{str(path)!r} was trained for {saved['steps']} updates, not {steps}: a "
                                     f"different --budget-updates or mu; use another --out")
        pending = [s for s, path in enumerate(paths[(design.name, lr)]) if not path.exists()]
        if run.batched and len(pending) > 1:
            units.append((design, lr, steps, pending))
        else:
            units += [(design, lr, steps, [s]) for s in pending]
    return paths, units


def train_units(run: VerifyRun, trainer: Trainer, units: list[tuple], paths: dict, log=print,
                progress: bool = False) -> dict:
    """Train ``units`` with ``trainer`` in this process or in ``--jobs`` worker processes (each builds its own from the
    run's config), logging each run's held-out reward; every cell's records, (design name, lr) -> one a seed."""
    workers = local_workers(run.plan.jobs, len(units)) if units else 1
    total = len(paths) * run.plan.seeds
    done = sum(path.exists() for ps in paths.values() for path in ps)
    if done or workers > 1:
        log(f"verify: {done} of {total} runs saved; training the other {total - done} "
            f"in {workers} process{'es' if workers > 1 else ''}")
    bar = ProgressBar("verify (design x seed runs)", total, done, enabled=progress)

    def log_unit(design: NamedDesign, lr: float, pending: list[int]) -> None:
        for s in pending:
            record = json.loads(paths[(design.name, lr)][s].read_text())
            log(f"{design.name:<20}{f' lr {lr:.3g}' if run.grid else ''} seed {s}: held-out reward "
                f"{record['held_out']['mean_reward']:.3f} (pass@1 {record['held_out']['pass@1']:.3f}) after "
                f"{record['steps']} updates")

    if workers == 1:
        for unit in units:
            design, lr, _, pending = unit
            _train_unit(trainer, unit, paths[(design.name, lr)], run.batched, bar)
            log_unit(design, lr, pending)
    else:  # independent runs, each seeded by its own seed: the same files whichever process trains them
        jobs = ((run.config, run.out_dir, run.mu, unit, paths[(unit[0].name, unit[1])], run.batched) for unit in units)
        for design, lr, pending in run_unordered(_train_unit_in_worker, jobs, workers, batch_size=1):
            for _ in pending:
                bar.advance()
            log_unit(design, lr, pending)
    records = {cell: [json.loads(path.read_text()) for path in cell_paths] for cell, cell_paths in paths.items()}
    bar.close()
    return records


def verify_report(run: VerifyRun, designs: list[NamedDesign], centres: dict, rules: dict, records: dict,
                  warm_evals: list[dict], predicted: dict, calibration: dict, started: float) -> dict:
    """report.json's content: each design's row at its best learning rate, the measured best, the verdict on the
    paper's prediction and the gap to it; in the fixed-b families each rule's prediction placed among them."""
    config, seeds = run.config, run.plan.seeds
    warm_mean, warm_sd = mean_sd([e["mean_reward"] for e in warm_evals])
    rows = [best_lr_row(design, run.lrs, records, seeds, warm_mean, warm_sd) for design in designs]
    best = max(rows, key=lambda r: r["final_reward_mean"])
    centre = centres.get("paper") or ("predicted" if any(r["name"] == "predicted" for r in rows) else "on-policy")
    names = [r["name"] for r in rows]

    def verdict_of(name: str) -> dict | None:  # the same seed-bootstrap draws for every prediction
        return (compare(np.array([r["final_rewards"] for r in rows]), names, names.index(name),
                        np.array([r["family"] for r in rows]), np.random.default_rng(config.seed),
                        draws=BOOTSTRAP_DRAWS, level=INTERVAL_LEVEL) if seeds >= 2 else None)

    verdict = verdict_of(centre)
    predicted_row = rows[names.index(centre)]
    report = {
        "mu": run.mu, "mu_priced": run.mu,
        "mu_measured": calibration["mu_timing"],  # this machine's timing mu: reported, not used for pricing
        "mu_count": calibration.get("mu_count"),
        "count_window": calibration.get("count_window", {}),
        "profile": json.loads((run.out_dir / "profile.json").read_text()).get("fits", {}),
        "profile_table": {"staleness": calibration["staleness"], "sigma_sq": calibration["sigma_sq"],
                          "rho": calibration["rho"]},
        "predicted": {k: predicted[k] for k in ("x_star", "y_star", "capacity", "batch_size", "rollouts_per_step",
                                                "regime")},
        "budget": {"updates": run.plan.budget_updates, "compute": run.budget, "seeds": seeds,
                   "group_replay": run.plan.group_replay, "lr_grid": list(run.lrs), "batched": run.batched,
                   "family": run.plan.family},
        "warm_start": warm_evals[0],
        "warm_start_reward": {"mean": warm_mean, "std": warm_sd, "seeds": seeds,
                              "by_seed": [e["mean_reward"] for e in warm_evals]},
        "designs": rows,
        "measured_best": best,
        "verdict": verdict,
        "learning_signal": {"design": best["name"], "gain": best["gain"], "standard_error": best["gain_se"],
                            "design_std": best["final_reward_std"], "warm_start_std": warm_sd, "seeds": seeds},
        "gap": {"x_predicted": predicted["x_star"], "x_best": best["x"],
                "y_predicted": predicted["y_star"], "y_best": best["y"],
                "design_predicted": centre, "reward_predicted": predicted_row["final_reward_mean"],
                "reward_best": best["final_reward_mean"],
                "reward_gap": best["final_reward_mean"] - predicted_row["final_reward_mean"]},
        "config": dataclasses.asdict(config),
        "seconds": time.perf_counter() - started,
    }
    if run.plan.family in FIXED_B_FAMILIES:
        memory, forgetting = rules["memory"], rules["forgetting"]
        report["forgetting_input"] = memory  # the kappa record, or why the forgetting-aware rule made no prediction
        report["predictions"] = prediction_rows(rows, centres, rules["pick"], rules["noise_record"], predicted,
                                                verdict_of, run.K, forgetting,
                                                memory if forgetting is not None else None, rules.get("optimal"))
    return report


def staleness_of_calibration(calibration: dict):
    """r(s) = 1 + 2 KL(s) from the calibration's exact drift KL(pi_t || pi_{t-s}) by lag (chi^2 and M2 are about 2 KL
    for a small drift): the forgetting rule's staleness cost, as the benchmark reads M2(s)
    (experiments/theory_bench/measure.py); none when the calibration measured no drift."""
    from ..theory.forgetting import NO_STALENESS, Staleness

    kl = {int(k): float(v) for k, v in (calibration.get("kl_by_lag") or {}).items() if v is not None}
    if not kl or any(not math.isfinite(v) or v < 0 for v in kl.values()):
        return NO_STALENESS
    ages = sorted(set(kl) | {0})
    return Staleness(tuple(float(a) for a in ages), tuple(1.0 + 2.0 * kl.get(a, 0.0) for a in ages),
                     "1 + 2 KL(s), the calibration's exact drift by lag")


def forgetting_memory(out_dir: Path, kappa: float | None, log=print) -> dict:
    """The optimizer memory the forgetting-aware rule reads: ``--kappa`` when given (the validator's optimizer, AdamW
    with beta1 0.9, measured at on-policy B), else profile.json's measured ``memory`` record; ``kappa`` None with a
    ``reason`` when neither exists (no default is invented). ``source`` says which."""
    try:
        measured = load_profile(out_dir / "profile.json").memory
    except (OSError, ValueError):
        measured = None
    if kappa is not None:
        if measured and measured.get("kappa") is not None:
            log(f"note: --kappa {kappa:g} is used; the profile's measured kappa {measured['kappa']:g} is recorded "
                "beside it in the report")
        return {"kappa": float(kappa), "optimizer": "adam", "beta1": 0.9, "pilot_batch": None, "source": "--kappa",
                "profile_memory": measured}
    if measured and measured.get("kappa") is not None:
        return {**measured, "source": "profile.json memory record"}
    reason = (f"the profile's kappa was not measured: {measured.get('reason')}" if measured else
              "no kappa: profile.json has no memory record and --kappa was not given")
    return {"kappa": None, "source": None, "reason": reason}


def _train_one(trainer: Trainer, design: NamedDesign, lr: float, seed: int, steps: int, path: Path,
               bar: StepBar) -> dict:
    """One verify run from the warm start (checkpointed every 5 steps, resumed exactly), evaluated held out."""
    policy = load_checkpoint(trainer.warm_start, device=trainer.device)
    rl = _rl_config(trainer.settings, design, steps, lr, trainer.train_seed(seed))
    checkpoint = path.with_suffix(".ckpt")  # a run interrupted mid-way resumes from here
    truncate_log(path.with_suffix(".jsonl"), checkpoint_next_step(checkpoint))
    step_log = StepLog(path.with_suffix(".jsonl"), tensorboard_dir=path.parent / "tensorboard" / path.stem)

    def on_step(step: int, metrics: dict) -> None:
        step_log(step, metrics)
        bar.tick()

    result = train(policy, trainer.train_set, rl, progress=on_step, checkpoint=checkpoint, checkpoint_every=5,
                   sampler=trainer.sampler, mu=trainer.mu)
    step_log.close()
    held_out = evaluate_policy(policy, trainer.test_set, 8, 1.0, trainer.max_new_tokens, seed=trainer.eval_seed(seed),
                               sampler=trainer.sampler)
    return _write_record(path, design, seed, steps, result, held_out)


def _train_unit(trainer: Trainer, unit: tuple, cell_paths: list[Path], batched: bool, bar: StepBar) -> None:
    """A unit (design, lr, steps, pending seeds) of one (design, learning rate) cell: its seeds together when
    ``batched``, else one after another."""
    design, lr, steps, pending = unit
    if batched and len(pending) > 1:
        _train_seeds(trainer, design, lr, pending, steps, cell_paths, bar)
        return
    for s in pending:
        _train_one(trainer, design, lr, s, steps, cell_paths[s], bar)
        bar.advance()


def _train_unit_in_worker(config: ValidateConfig, out_dir: Path, mu: float, unit: tuple, cell_paths: list[Path],
                          batched: bool) -> tuple[NamedDesign, float, list[int]]:
    """``_train_unit`` in a ``--jobs`` worker process: it builds what ``run_verify`` holds (torch's threads and
    deterministic kernels, the problems, the engine: its ``Trainer``) and writes the same record files."""
    configure_torch(config.threads)
    train_set, test_set = config.problems()
    trainer = Trainer(out_dir / "warm_start", config.device, verify_settings(config), mu, train_set, test_set,
                      get_sampler(config, out_dir))
    _train_unit(trainer, unit, cell_paths, batched, _WorkerBar())
    design, lr, _, pending = unit
    return design, lr, pending


class StepBar(Protocol):
    """What a (design, learning rate) cell reports each step to: the main process's ``ProgressBar`` or, in a
    ``--jobs`` worker, ``_WorkerBar``."""

    def tick(self) -> None: ...

    def advance(self) -> None: ...


class _WorkerBar:
    """A ``--jobs`` worker's stand-in for the progress bar (the main process draws it). At every step it checks that
    the verify that started this worker is alive: a worker whose verify was killed (SIGTERM, SIGKILL) would otherwise
    train on as an orphan beside a restarted verify. It stops within a step; the run's checkpoint resumes it."""

    def __init__(self):
        self.parent = os.getppid()

    def tick(self) -> None:
        if os.getppid() != self.parent:
            raise SystemExit(f"verify (process {self.parent}) is gone; this worker stops")

    def advance(self) -> None:
        self.tick()

    def update(self, done: int) -> None:
        self.tick()

    def close(self) -> None:
        pass


def _lr_tag(lr: float) -> str:
    return f"_lr{lr:.3g}"


def _train_seeds(trainer: Trainer, design: NamedDesign, lr: float, pending: list[int], steps: int, paths: list[Path],
                 bar: StepBar) -> None:
    """``_train_one`` for the seeds ``pending`` of one design at once (seeds as a batch axis, validate/batched.py).

    Seed s trains with the streams of ``config.seed + 101 s`` and is evaluated with ``config.seed + 1 + s``, as in
    ``_train_one``: each record equals the sequential one (tests/integration/test_validate_batched.py). One checkpoint
    holds every pending seed (every 5 steps, resumed exactly); records are written when all of them finish.
    """
    seeds = [trainer.train_seed(s) for s in pending]
    policy = stack_policy(load_checkpoint(trainer.warm_start, device=trainer.device), len(pending))
    rl = _rl_config(trainer.settings, design, steps, lr, trainer.settings.seed)
    checkpoint = paths[pending[0]].with_name(f"{paths[pending[0]].stem.rsplit('_seed', 1)[0]}_seeds"
                                             f"{'-'.join(map(str, pending))}.ckpt")
    next_step = checkpoint_next_step(checkpoint)
    logs = []
    for s in pending:
        truncate_log(paths[s].with_suffix(".jsonl"), next_step)
        logs.append(StepLog(paths[s].with_suffix(".jsonl"),
                            tensorboard_dir=paths[s].parent / "tensorboard" / paths[s].stem))

    def on_step(step: int, seed_metrics: list[dict]) -> None:
        for step_log, metrics in zip(logs, seed_metrics):
            step_log(step, metrics)
            bar.tick()

    results = train_loop(policy, trainer.train_set, rl, seeds, progress=on_step, checkpoint=checkpoint,
                         checkpoint_every=5, sampler=trainer.sampler, mu=trainer.mu)
    for step_log in logs:
        step_log.close()
    held_out = evaluate_policies(policy, trainer.test_set, 8, 1.0, trainer.max_new_tokens,
                                 [trainer.eval_seed(s) for s in pending], sampler=trainer.sampler)
    for s, result, evaluation in zip(pending, results, held_out):
        _write_record(paths[s], design, s, steps, result, evaluation)
        bar.advance()


def _write_record(path: Path, design: NamedDesign, seed: int, steps: int, result, held_out: dict) -> dict:
    record = {"design": design.report_fields(), "seed": seed, "steps": steps,
              "fresh_rollouts": result.k_inference, "samples_trained": result.k_training,
              "compute": result.compute,  # charged by the pipeline from the counted rollouts
              "held_out": held_out, "train_reward": [m["reward"] for m in result.metrics]}
    # whole or not at all: a run killed while writing (Ctrl-C, a --jobs worker stopped) leaves no half record
    write_new(path, lambda tmp: tmp.write_text(json.dumps(record, indent=1, default=float)))
    return record


