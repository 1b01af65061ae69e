"""Reference tests: bf16 and fp16 training on real digits stay close to the fp32 reference."""

import pytest
import torch

from ampbench.config.params import PrepareParams, TrainParams
from ampbench.data.prepare import prepare
from ampbench.models.builtins import build_builtin
from ampbench.precision.policy import resolve_policy
from ampbench.runtime.determinism import seed_everything
from ampbench.tasks.classification import predict
from ampbench.training.loop import fit, init_state
from ampbench.training.state import LoopConfig
from ampbench.verdict.metrics import arm_seed_metrics

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return prepare(PrepareParams(dataset="digits", max_train=480), tmp_path_factory.mktemp("raw"))


def _train(arm, data):
    seed_everything(0)
    policy = resolve_policy(arm, CPU)
    policy.apply_backend_flags()
    model = build_builtin("small_cnn", data.input_shape, data.num_classes, width=8)
    cfg = LoopConfig(TrainParams(epochs=4, batch_size=32, lr=0.01, progress=False), seed=0)
    state = init_state(model, policy, cfg, CPU)
    fit(state, data.train, data.val, policy, cfg)
    return model, policy


@pytest.fixture(scope="module")
def fp32_ref(digits):
    model, policy = _train("fp32", digits)
    return predict(model, digits.test, policy, 512)


@pytest.mark.parametrize("arm", ["bf16", "fp16"])
def test_16bit_training_matches_fp32(digits, fp32_ref, arm):
    model, policy = _train(arm, digits)
    own = predict(model, digits.test, policy, 512)
    f32 = predict(model, digits.test, resolve_policy("fp32", CPU), 512)
    m = arm_seed_metrics(own, f32, fp32_ref, digits.test.y)
    ref_acc = (fp32_ref.argmax(1) == digits.test.y).float().mean().item()
    assert ref_acc > 0.85, "the fp32 reference itself must have learned the task"
    assert abs(m["delta_accuracy_vs_fp32"]) <= 0.04
    assert m["agreement_vs_fp32"] >= 0.9
    assert m["kl_vs_fp32"] < 0.1
    # Same weights evaluated in fp32 vs in the arm's own dtype: nearly the same predictions.
    assert abs(m["test_accuracy_fp32eval"] - m["test_accuracy"]) <= 0.02
