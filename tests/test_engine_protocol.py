"""The engine <-> algorithm seam (grpo/protocol.py): who implements it, what the loop does when a piece is missing."""
from __future__ import annotations

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.registry import MODELS

from engine_toy import ToyREINFORCE, ToyTrainModel, run_config, write_toy_config
from grpo_tiny import build_tiny, make_algo, one_thread
from projects.llava_sam2.rl_train.engine.registry import ALGORITHMS
from projects.llava_sam2.rl_train.engine.train_model import Sa2VATrainModel
from projects.llava_sam2.rl_train.grpo.protocol import (ALGORITHM_ATTRIBUTES, ALGORITHM_STAGES, STAGE_OUTPUTS,
                                                        TRAIN_MODEL_METHODS, GRPOAlgorithm, GRPOTrainModel,
                                                        check_algorithm, missing_members)
from projects.llava_sam2.rl_train.grpo.trainer import CycleGRPO
from projects.llava_sam2.rl_train.grpo.weights import WeightSets

_single_thread = pytest.fixture(autouse=True)(one_thread)


def test_the_member_tables_list_exactly_the_protocol():
    # check_algorithm's error names members from the tables: they must be the protocol's members, no more, no less
    declared = set(GRPOAlgorithm.__annotations__) | {n for n in vars(GRPOAlgorithm) if not n.startswith("_")}
    assert declared == set(ALGORITHM_ATTRIBUTES) | set(ALGORITHM_STAGES)
    assert {n for n in vars(GRPOTrainModel) if not n.startswith("_")} == set(TRAIN_MODEL_METHODS)
    # every stage that hands a value on names its type, and the protocol's annotations say the same
    for stage, output in STAGE_OUTPUTS.items():
        assert getattr(GRPOAlgorithm, stage).__annotations__["return"] == output.__name__


def test_cycle_grpo_and_the_toy_implement_the_protocol():
    model, processor = build_tiny()
    algo, weights = make_algo(model, processor)
    assert isinstance(algo, GRPOAlgorithm) and isinstance(algo, CycleGRPO)
    assert missing_members(algo) == [] and check_algorithm(algo, "test") is algo
    assert algo.weights is weights and algo.model is model  # the algorithm owns the weight sets it was given

    toy_model = ToyTrainModel()
    assert isinstance(toy_model, GRPOTrainModel)
    toy = toy_model.build_algorithm(dict(type=ToyREINFORCE))
    assert isinstance(toy, GRPOAlgorithm) and missing_members(toy) == []
    assert isinstance(toy.weights, WeightSets) and toy.model is toy_model.policy
    assert not hasattr(toy_model, "weights")  # the train model builds the weight sets, the algorithm keeps them
    assert issubclass(Sa2VATrainModel, GRPOTrainModel)


class ToyWithoutAdvantages(ToyREINFORCE):  # registered by name: a lazy config cannot hold a test-local class
    compute_advantages = None  # a stage that is not callable counts as missing


class ToyScoringInPlace(ToyREINFORCE):  # an algorithm written against the old hand-off: score fills its input
    def score(self, sampled):
        super().score(sampled)


class ModelWithoutBuilder(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(2, 2)

    def forward(self, *args, **kwargs):
        raise AssertionError("never reached: the loop refuses the model first")


def test_protocol_rejects_objects_and_names_what_they_lack():
    class Partial:
        model, weights = torch.nn.Linear(1, 1), object()

        def encode(self, batch):
            return batch

    assert not isinstance(Partial(), GRPOAlgorithm)
    assert missing_members(Partial()) == ["rollout", "score", "compute_advantages", "minibatches", "policy_loss",
                                          "after_optimizer_step"]
    with pytest.raises(TypeError, match=r"where: Partial does not implement .* lacks rollout, score,"):
        check_algorithm(Partial(), "where")


def test_the_loop_rejects_an_algorithm_missing_a_stage(tmp_path):
    ALGORITHMS.register_module(module=ToyWithoutAdvantages, force=True)
    with pytest.raises(TypeError, match=r"GRPOLoop: train_cfg.algorithm: ToyWithoutAdvantages .* lacks "
                                        r"compute_advantages\."):
        run_config(write_toy_config(tmp_path), tmp_path, **{"train_cfg.algorithm": dict(type="ToyWithoutAdvantages")})


def test_the_loop_rejects_a_stage_that_returns_no_hand_off(tmp_path):
    ALGORITHMS.register_module(module=ToyScoringInPlace, force=True)
    with pytest.raises(TypeError, match=r"ToyScoringInPlace.score returned NoneType; .* score must return a "
                                        r"ScoredStep"):
        run_config(write_toy_config(tmp_path), tmp_path, **{"train_cfg.algorithm": dict(type="ToyScoringInPlace")})


def test_the_loop_rejects_a_train_model_without_build_algorithm(tmp_path):
    MODELS.register_module(module=ModelWithoutBuilder, force=True)
    with pytest.raises(TypeError, match=r"GRPOLoop: the train model ModelWithoutBuilder has no build_algorithm, "
                                        r"rollout_context, update_context"):
        run_config(write_toy_config(tmp_path), tmp_path, **{"model": dict(type="ModelWithoutBuilder")})
