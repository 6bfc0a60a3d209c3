"""TP2, TP4 and TP8 against TP1 on the CPU (gloo, stock path): the layer's
split of KV heads, experts and o_proj partial sums is right at every TP size
the GPUs will run. The GPU version (nccl, fused ops, one H200 per rank) is
`python tests/python/tp_layer_check.py`."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_matches_tp1_on_cpu(tp):
    import tp_layer_check

    results = tp_layer_check.run("gloo", "stock", world=tp, port=29540 + tp)
    assert [r[0] for r in results] == list(range(tp))
    assert [r[1] for r in results] == ["ok"] * tp, results
    assert all(0 < r[2] <= 5e-3 for r in results), results


@pytest.mark.parametrize("tp", [1, 3, 16])
def test_unserved_tp_size_is_refused(tp):
    import tp_layer_check

    with pytest.raises(ValueError, match="world"):
        tp_layer_check.run("gloo", "stock", world=tp)


def test_timing_needs_the_fused_path():
    import tp_layer_check

    with pytest.raises(ValueError, match="timed"):
        tp_layer_check.run("gloo", "stock", world=2, timed=True)
