"""The seam between the engine's train loop and a GRPO algorithm, spelled out (as MMEngine's ``Hook`` lists its stages).

Who does what:

* **The train model builds the algorithm.** ``GRPOLoop.run()`` calls ``build_algorithm(train_cfg.algorithm)`` on the
  unwrapped train model (``engine.Sa2VATrainModel``; the tests' ``ToyTrainModel``), after the runner placed and
  wrapped the model, because only the model has the live pieces: the policy module, the processor and where weight
  copies may live (``weights_storage_device``). It creates the ``WeightSets`` and hands them to the algorithm; it
  keeps no reference to either (``GRPOTrainModel``).
* **The loop owns the algorithm** (``GRPOLoop.algorithm``) and calls its stages, in this order, once per iteration::

      with train_model.rollout_context(optim_wrapper):
          features = algorithm.encode(batch)
          sampled = algorithm.rollout(features)         # SampledStep; hook after_rollout(rollouts=sampled.rollouts)
      scored = algorithm.score(sampled)                 # ScoredStep; hook after_reward(rollouts=scored.rollouts)
      advantaged = algorithm.compute_advantages(scored) # AdvantagedStep
      with train_model.update_context(optim_wrapper):
          for minibatch in algorithm.minibatches(advantaged):
              runner.model.train_step({'grpo_batch': minibatch, 'algorithm': algorithm}, optim_wrapper)
                  # train model forward: algorithm.policy_loss(policy_module, minibatch), with grad
      algorithm.after_optimizer_step()                  # hook after_train_iter

* **Each stage returns what the next consumes** (grpo/rollout.py: ``SampledStep``, ``ScoredStep``,
  ``AdvantagedStep``, each carrying the step's features and one ``Rollout`` per active loop) and leaves its input
  unchanged; nothing is kept on the algorithm between stages. The loop checks each returned value's type
  (``check_stage_output``), so an algorithm written against another hand-off fails at its first step, naming the
  stage.
* **The train model owns precision.** The loop enters the contexts the train model gives it
  (``GRPOTrainModel.rollout_context`` / ``update_context``, built from the optimizer wrapper it is handed) and knows
  nothing about autocast or adapter dtypes.
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
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from .rollout import AdvantagedStep, SampledStep, ScoredStep
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

    def rollout(self, features: Any) -> SampledStep:
        """Called by the loop after ``encode``, no grad: a ``SampledStep`` with one ``Rollout`` (N = B * G rows,
        ``rewards`` [B, G] still NaN) per active loop; the loop then calls the ``after_rollout`` hooks with its
        ``rollouts``."""

    def score(self, sampled: SampledStep) -> ScoredStep:
        """Called by the loop after ``rollout``: a ``ScoredStep`` whose rollouts are copies of ``sampled``'s with
        ``rewards`` [B, G] (NaN where no reward applies) and ``reward_stats`` set; ``sampled`` stays as it was. The
        loop then calls the ``after_reward`` hooks with its ``rollouts``."""

    def compute_advantages(self, scored: ScoredStep) -> AdvantagedStep:
        """Called by the loop after ``score``: an ``AdvantagedStep`` whose rollouts are copies of ``scored``'s with
        ``advantages`` [N] set; ``scored`` stays as it was."""

    def minibatches(self, advantaged: AdvantagedStep) -> Iterable[Any]:
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

    def rollout_context(self, optim_wrapper: Any) -> AbstractContextManager:
        """Entered by the loop around ``encode`` and ``rollout``: the precision the no-grad passes run in, chosen
        by the model for the optimizer wrapper it trains with (the same arithmetic as ``train_step``'s forward)."""

    def update_context(self, optim_wrapper: Any) -> AbstractContextManager:
        """Entered by the loop around the iteration's ``train_step`` calls (forward, backward and optimizer step)."""


TRAIN_MODEL_METHODS = ("build_algorithm", "rollout_context", "update_context")
ALGORITHM_ATTRIBUTES = ("model", "weights")
# stage -> the type of the value it returns (the next stage's input)
STAGE_OUTPUTS = {"rollout": SampledStep, "score": ScoredStep, "compute_advantages": AdvantagedStep}
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


def missing_train_model_methods(model: Any) -> list[str]:
    """The ``GRPOTrainModel`` methods ``model`` lacks (or has as non-callables)."""
    return [name for name in TRAIN_MODEL_METHODS if not callable(getattr(model, name, None))]


def check_stage_output(value: Any, stage: str, algorithm: Any) -> Any:
    """``value`` itself if it is what ``algorithm.<stage>`` must return (``STAGE_OUTPUTS``); else a ``TypeError``
    naming the stage, the type it returned and the one expected."""
    expected = STAGE_OUTPUTS[stage]
    if not isinstance(value, expected):
        raise TypeError(f"{type(algorithm).__name__}.{stage} returned {type(value).__name__}; a GRPOAlgorithm stage "
                        f"returns what the next one consumes (grpo/protocol.py): {stage} must return a "
                        f"{expected.__name__} (grpo/rollout.py) and leave its input unchanged.")
    return value
