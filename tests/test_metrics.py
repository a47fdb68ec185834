"""MFU's denominator: each GPU's dense bf16 peak from its data sheet, matched by CUDA name."""

import pytest

from training.instruments.metrics import peak_flops_of


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),  # SXM
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),  # data sheet: 1671 TFLOP/s with sparsity
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GeForce RTX 4090", None),  # not in the table: no MFU rather than a wrong one
    ],
)
def test_each_gpu_gets_its_own_data_sheet_peak(name, peak):
    assert peak_flops_of(name) == peak
