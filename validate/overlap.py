"""Generation in its own process beside the update: the validator's k-step-off trainer with generation overlapped.

Papers (docs/REFERENCES.md): M2PO Sec. 3 (stale-k: each batch trained k updates after it is generated); the
asynchronous trainers of issue 40 (verl's one-step-off and fully async queues, TRL's async GRPO, AReaL, PipelineRL)
run generation on their own devices while the trainer updates. docs/THEORY.md [T1] prices what that buys.

``GenerationWorker`` is the pipeline's rollout backend (``core.pipeline.RolloutBackend``) with its sampling done by
a worker process that holds its own copy of the policy and the seeds' token generators: the process is the
generation's share of the machine (gamma of the pool), the trainer's process the rest. ``core.designs``'s
``stale_k_overlapped`` calls ``sample`` from a second thread while the trainer updates; the thread only waits on the
worker, so the two sides run on separate cores without sharing an interpreter lock. The prompts are drawn by the
pipeline in the trainer's process (its numpy stream), the tokens in the worker (its torch generators, handed over
at start and read back for a checkpoint), so a run gives the same numbers with or without the worker
(``tests/integration/test_validate_overlap.py``).

| code name          | paper symbol | meaning                                                            |
|--------------------|--------------|--------------------------------------------------------------------|
| ``sync``           | theta_t      | the trainer's weights copied to the worker's shared copy before t  |
| ``threads``        | gamma        | the worker's intra-op threads: its share of the CPU                |
"""

from __future__ import annotations

import copy
import multiprocessing
import time
import traceback
from typing import Callable

import numpy as np
import torch

from .policy import Policy


def _serve(connection, policy: Policy, make_backend: Callable, generator_states: list, threads: int,
           deterministic: bool) -> None:
    """The worker's loop: ("sample", prompts, prompt_width) answers the backend's sample on the shared weights,
    ("generators",) sends the token generators' states, ("set-generators", states) sets them, ("stop",) ends.
    Errors go back as one line each, with their traceback."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    generators = [torch.Generator() for _ in generator_states]  # CPU generators (the worker runs on the CPU)
    for generator, state in zip(generators, generator_states):
        generator.set_state(state)
    backend = make_backend(generators[0] if len(generators) == 1 else generators)
    policy.model.eval()
    connection.send(("ok", None))  # ready: the start-up is not a step's time
    while True:
        message = connection.recv()
        try:
            if message[0] == "stop":
                return
            if message[0] == "generators":
                connection.send(("ok", [generator.get_state() for generator in generators]))
            elif message[0] == "set-generators":
                for generator, state in zip(generators, message[1]):
                    generator.set_state(state)
                connection.send(("ok", None))
            else:  # ("sample", prompts, prompt_width)
                backend.prompt_width = message[2]
                generation, compiling = backend.generation_seconds, backend.compile_seconds
                out = backend.sample(policy, message[1])
                connection.send(("ok", (out, backend.info, backend.generation_seconds - generation,
                                        backend.compile_seconds - compiling)))
        except Exception as error:  # noqa: BLE001 (sent back whole: the trainer raises it)
            connection.send(("error", f"{type(error).__name__}: {error}", traceback.format_exc()))


class GenerationWorker:
    """The language model's rollout backend with generation in a worker process (see the module docstring).

    ``sample(weights, prompts)`` ignores ``weights``: the worker generates from the copy ``sync`` gave it, which the
    trainer refreshes before every step (``validate.rl.train_loop``), so it is the trainer's theta_t at that step's
    start whatever the update does meanwhile. Timings: ``generation_seconds`` and ``compile_seconds`` are the
    worker's own; ``transfer_seconds`` the weight copies; ``startup_seconds`` the worker's start, once a run, in no
    step's time. CPU only (a CUDA worker would need its own context and the
    weights moved between processes on the device, which this class does not do).
    """

    def __init__(self, policy: Policy, make_backend: Callable, generators, threads: int = 1):
        """``make_backend(generators)``: the in-process backend the worker runs (``validate.rl.LMBackend`` with its
        problems, config and HF sampler bound; picklable), given the worker's copies of ``generators``."""
        if policy.device.type != "cpu":
            raise ValueError(f"generation in a worker process runs on the CPU, the policy is on {policy.device}; "
                             "overlap generation with the update only on the CPU")
        template = make_backend(generators)  # what the pipeline reads of a backend: its sizes
        self.num_prompts, self.seq_len = template.num_prompts, template.seq_len
        self.prompt_width: int | None = None
        self.info: list[dict[str, float]] = []
        self.generation_seconds = self.compile_seconds = self.transfer_seconds = 0.0
        many = isinstance(generators, (list, tuple))
        self._generators = list(generators) if many else [generators]
        states = [generator.get_state() for generator in self._generators]
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
        self._connection, child = context.Pipe()
        # The worker's weights: a copy in shared memory, which the worker maps (torch pickles a shared tensor by
        # handle, and would move the trainer's own parameters there if they were sent): ``sync`` writes into it
        # while the worker waits between samples, a weight transfer with no pickling.
        self._weights = copy.deepcopy(policy.model).share_memory()
        worker_policy = Policy(model=self._weights, tokenizer=policy.tokenizer, device=policy.device,
                               config=policy.config, stop_token_ids=policy.stop_token_ids)
        self._process = context.Process(target=_serve, name="generation", daemon=True, args=(
            child, worker_policy, make_backend, states, threads,
            torch.are_deterministic_algorithms_enabled()))
        started = time.perf_counter()
        self._process.start()
        child.close()
        self._reply()  # the worker's start-up (an interpreter, torch, the model): once a run, before its steps
        self.startup_seconds = time.perf_counter() - started

    def _call(self, *message):
        self._connection.send(message)
        return self._reply()

    def _reply(self):
        try:
            reply = self._connection.recv()
        except EOFError:
            raise RuntimeError(f"generation worker exited (code {self._process.exitcode})") from None
        if reply[0] == "error":
            raise RuntimeError(f"generation worker: {reply[1]}\n{reply[2]}")
        return reply[1]

    def sync(self, policy: Policy) -> None:
        """Copy the trainer's weights to the worker's shared copy: call it only between samples (the worker reads
        the copy while it generates), as ``train_loop`` does before each step."""
        started = time.perf_counter()
        with torch.no_grad():
            self._weights.load_state_dict(policy.model.state_dict())  # in place: the worker sees it at its next sample
        self.transfer_seconds += time.perf_counter() - started

    def sample(self, weights, prompts: np.ndarray):
        out, self.info, generation, compiling = self._call("sample", prompts, self.prompt_width)
        self.generation_seconds += generation
        self.compile_seconds += compiling
        return out

    def entropy(self, weights, prompts, tokens, mask):
        raise ValueError("the language-model backend does not compute token entropies")

    def snapshot(self, weights):
        raise ValueError("the language-model backend runs the synchronous pipeline")

    def pull_generators(self) -> None:
        """Set the trainer's token generators to the worker's states (before a checkpoint saves them)."""
        for generator, state in zip(self._generators, self._call("generators")):
            generator.set_state(state)

    def push_generators(self) -> None:
        """Set the worker's token generators to the trainer's states (after a resumed checkpoint loaded them)."""
        self._call("set-generators", [generator.get_state() for generator in self._generators])

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._connection.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.terminate()
        self._connection.close()
