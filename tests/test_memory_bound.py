"""The memory-bound workloads (issue 30): GPT-1.3B, GPT-2.7B and BERT-Large
do not fit one 16 GB V100, and their cached graphs are what the tiling rule
makes (per-layer copies, batch marks, real persistent bytes)."""
import collections
import json
import re

import pytest

from benchmarks.make_graphs import GRAPHS, WORKLOADS, by_key, load, select
from benchmarks.memory_bound import KEYS, LOSS_OP, figures
from pesto.cluster import GiB, gpus, preset
from pesto.errors import InfeasibleError
from pesto.memory import check_feasible, live_across

V100 = 16 * GiB
#: parameters of the presets (tf_patch.zoo.gpt.parameters; untied output projection)
PARAMETERS = {"gpt_1.3b": 1_416_795_264, "gpt_2.7b": 2_777_880_704, "bert_large": 366_426_938}
LAYERS = {"gpt_1.3b": 24, "gpt_2.7b": 32, "bert_large": 24}


@pytest.fixture(scope="module", params=KEYS)
def workload(request):
    g, source = load(by_key(request.param))
    assert source.startswith("zoo"), f"{request.param}: cached graph missing"
    return request.param, g


def test_persistent_bytes_are_weights_and_adam_slots(workload):
    key, g = workload
    pers = sum(op.persistent_bytes for op in g.ops)
    assert pers == 12 * PARAMETERS[key] + 8  # fp32 weight + m + v per parameter, and Adam's two beta powers


def test_every_op_has_a_batch_mark_and_layers_are_copies(workload):
    key, g = workload
    assert all(op.batch is not None for op in g.ops)
    assert any(op.batch for op in g.ops) and not all(op.batch for op in g.ops)
    per = collections.Counter()
    work = collections.defaultdict(float)
    for op in g.ops:
        m = re.search(r"(?:^|/)(?:update_)?layer_(\d+)/", op.name)
        if m:
            k = int(m.group(1))
            per[k] += 1
            work[k] += op.compute["GPU"]
    assert sorted(per) == list(range(LAYERS[key]))
    assert len(set(per.values())) == 1 and len({round(w, 6) for w in work.values()}) == 1


def test_no_gradient_sum_is_colocated(workload):
    """The colocation tf.gradients gives a sum (with its first summand: the
    previous layer's sum along the residual stream) is not a group
    (tf_patch.extract.aggregation_colocated); the variables' groups stay."""
    key, g = workload
    assert not [op.name for op in g.ops if op.type == "AddN" and op.colocation_group]
    updates = [op for op in g.ops if op.type == "ResourceApplyAdam"]
    assert updates and all(op.colocation_group for op in updates)


def test_no_one_gpu_plan_fits(workload):
    """Persistent bytes plus the activations held when the loss ends exceed
    one V100 (any plan); GPT-2.7B's persistent bytes alone already do, and
    the pre-solve check says so."""
    key, g = workload
    pers = sum(op.persistent_bytes for op in g.ops)
    assert pers + live_across(g, LOSS_OP) > V100
    if key == "gpt_2.7b":
        with pytest.raises(InfeasibleError, match="exceed the memory of all devices") as err:
            check_feasible(g, gpus(1))
        assert err.value.culprit == "total"
    else:
        check_feasible(g, gpus(1))   # the pre-check sees persistent bytes only
    for name in ("v100x8_nvlink", "hosts4x2_ib_hdr"):
        check_feasible(g, preset(name))   # 8 GPUs hold the weights and slots


def test_figures_and_manifest_agree():
    manifest = json.loads((GRAPHS / "manifest.json").read_text())
    for key in KEYS:
        f = figures(key)
        entry = manifest[key]
        assert entry["ops"] == f.ops and entry["tiled"]
        assert f.floor_bytes > V100 and f.activation_bytes > 0
        assert abs(entry["persistent_gb"] - f.persistent_bytes / 1e9) < 1e-3
        assert (GRAPHS / f"{key}.json.gz").stat().st_size < 20e6
    assert f.one_gpu == "passes" and figures("gpt_2.7b").one_gpu == "InfeasibleError (total)"


def test_select_takes_keys_and_model_names():
    assert KEYS == ("gpt_1.3b", "gpt_2.7b", "bert_large")
    assert not set(KEYS) & {w.key for w in WORKLOADS}   # the 2-4 GPU placement benchmarks leave them out
    assert [w.key for w in select("gpt")] == ["gpt_1.3b", "gpt_2.7b"]
    assert [w.key for w in select("bert,transformer_6,bert_large")] == ["bert_large", "transformer_6"]
    with pytest.raises(KeyError, match="unknown workload 'nope'"):
        select("nope")
