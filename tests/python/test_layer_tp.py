"""TP2 against TP1 on the CPU (gloo, stock path): the layer's split of KV
heads, experts and o_proj partial sums is right. The GPU version (nccl, fused
ops, two H200s) is `python tests/python/tp_layer_check.py`."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_tp2_matches_tp1_on_cpu():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tp_layer_check

    results = tp_layer_check.run("gloo", "stock")
    assert [s for _, s, _ in results] == ["ok", "ok"], results
