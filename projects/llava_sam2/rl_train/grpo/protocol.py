"""The seam between the engine's train loop and a GRPO algorithm, spelled out (as MMEngine's ``Hook`` lists its stages).

Who does what:

* **The train model builds the algorithm.** ``GRPOLoop.run()`` calls ``build_algorithm(train_cfg.algorithm)`` on the
  unwrapped train model (``engine.Sa2VATrainModel``; the tests' ``ToyTrainModel``), after the runner placed and
  wrapped the model, because only the model has the live pieces: the policy module, the processor and where weight
  copies may live (``weights_storage_device``). It creates the ``WeightSets`` and hands them to the algorithm; it
  keeps no reference to either (``GRPOTrainModel``).
* **The loop owns the algorithm** (``GRPOLoop.algorithm``) and calls its stages, in this order, once per iteration::

      features = algorithm.encode(batch)
      rollouts = algorithm.rollout(features)            # hook after_rollout
      algorithm.score(rollouts)                         # hook after_reward
      algorithm.compute_advantages(rollouts)
      for minibatch in algorithm.minibatches(rollouts):
          runner.model.train_step({'grpo_batch': minibatch, 'algorithm': algorithm}, optim_wrapper)
              # train model forward: algorithm.policy_loss(policy_module, minibatch), with grad
      algorithm.after_optimizer_step()                  # hook after_train_iter

* **The algorithm owns the weight sets** (``algorithm.weights``, policy / EMA partner / reference over
  ``algorithm.model``'s trainable tensors) and swaps them inside its stages. ``EMAPartnerHook`` reaches them through
  the loop: ``algorithm.weights.update_partner(algorithm.model)`` after each iteration's optimizer step(s), and
  ``algorithm.weights.state_dict()`` / ``load_state_dict()`` for checkpoints.
* Minibatches are opaque to the engine: the loop passes what ``minibatches`` yields to ``train_step`` untouched, and
  the train model hands it back to ``policy_loss`` together with the algorithm itself (a minibatch carries no
  reference to the algorithm).

``GRPOAlgorithm`` is ``runtime_checkable``; ``check_algorithm`` names what a built object lacks.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from .rollout import Rollout
from .weights import WeightSets


@runtime_checkable
class GRPOAlgorithm(Protocol):
    """What ``GRPOLoop`` and ``EMAPartnerHook`` use of an algorithm (``grpo.trainer.CycleGRPO``; tests' toy).

    Attributes:
        model: the unwrapped policy module (e.g. ``Sa2VAModel``) that ``weights`` pairs with.
        weights: the ``WeightSets`` (policy / EMA partner / reference); the EMA hook updates and checkpoints them.
    """

    model: nn.Module
    weights: WeightSets

    def encode(self, batch: Sequence) -> Any:
        """Called by the loop first in each iteration: the frozen encoders' features of the prompt batch (B samples),
        computed once and shared by every later stage (``CycleGRPO``: ``StepFeatures``)."""

    def rollout(self, features: Any) -> list[Rollout]:
        """Called by the loop after ``encode``, no grad: one ``Rollout`` (N = B * G rows, ``rewards`` [B, G] still
        NaN) per active loop; the loop then calls the ``after_rollout`` hooks."""

    def score(self, rollouts: list[Rollout]) -> None:
        """Called by the loop after ``rollout``: fill each rollout's ``rewards`` [B, G] (NaN where no reward
        applies) and ``reward_stats``, in place; the loop then calls the ``after_reward`` hooks."""

    def compute_advantages(self, rollouts: list[Rollout]) -> None:
        """Called by the loop after ``score``: replace ``rollouts[i]`` by its copy with ``advantages`` [N] set."""

    def minibatches(self, rollouts: list[Rollout]) -> Iterable[Any]:
        """Called by the loop after ``compute_advantages``: at least one minibatch; each becomes one
        ``train_step`` (one backward; one optimizer step per ``accumulative_counts`` of them)."""

    def policy_loss(self, model: nn.Module, minibatch: Any) -> Mapping[str, Tensor]:
        """Called by the train model's ``forward`` inside ``train_step``, with grad: ``{'loss': scalar, '<loop>/
        <stat>': detached diagnostics}``; ``model`` is the policy module the gradients must reach."""

    def after_optimizer_step(self) -> None:
        """Called by the loop after the iteration's last ``train_step``, before the ``after_train_iter`` hooks
        (where ``EMAPartnerHook`` updates the partner)."""


@runtime_checkable
class GRPOTrainModel(Protocol):
    """What ``GRPOLoop`` uses of the unwrapped train model (``engine.Sa2VATrainModel``) besides ``train_step``.

    Its ``forward(grpo_batch=minibatch, algorithm=algorithm)`` returns ``algorithm.policy_loss(policy_module,
    minibatch)`` with the ``loss`` under a key the model's ``parse_losses`` sums (``grpo_loss``).
    """

    def build_algorithm(self, cfg: Mapping[str, Any]) -> GRPOAlgorithm:
        """Called once by ``GRPOLoop.run()``: build ``train_cfg.algorithm`` with the model's live pieces and a new
        ``WeightSets`` that the algorithm owns."""


ALGORITHM_ATTRIBUTES = ("model", "weights")
ALGORITHM_STAGES = ("encode", "rollout", "score", "compute_advantages", "minibatches", "policy_loss",
                    "after_optimizer_step")


def missing_members(algorithm: Any) -> list[str]:
    """The ``GRPOAlgorithm`` members ``algorithm`` lacks (stages that are not callable count as missing)."""
    missing = [name for name in ALGORITHM_ATTRIBUTES if getattr(algorithm, name, None) is None]
    return missing + [name for name in ALGORITHM_STAGES if not callable(getattr(algorithm, name, None))]


def check_algorithm(algorithm: Any, where: str) -> GRPOAlgorithm:
    """``algorithm`` itself if it implements ``GRPOAlgorithm``; else a ``TypeError`` naming what it lacks."""
    missing = missing_members(algorithm)
    if missing:
        raise TypeError(f"{where}: {type(algorithm).__name__} does not implement the GRPOAlgorithm protocol "
                        f"(grpo/protocol.py): it lacks {', '.join(missing)}. An algorithm needs the attributes "
                        f"{', '.join(ALGORITHM_ATTRIBUTES)} and the stages {', '.join(ALGORITHM_STAGES)}.")
    return algorithm
