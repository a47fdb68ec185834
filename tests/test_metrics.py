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


def test_wandb_mode_from_the_environment_wins_over_the_config(tmp_path, monkeypatch):
    """``WANDB_MODE=disabled`` (a cluster's or CI's way to turn wandb off) used to be overridden
    by the config's default ``offline``, which still wrote an ``offline-run-*`` folder."""
    from training.instruments.metrics import MetricsLogger, WandbConfig, wandb_mode

    monkeypatch.setenv("WANDB_MODE", "disabled")
    logger = MetricsLogger(tmp_path, WandbConfig(mode="offline"), {}, "run")
    logger.close()
    assert logger.wandb is None and not (tmp_path / "wandb").exists()
    monkeypatch.delenv("WANDB_MODE")
    assert wandb_mode(WandbConfig(mode="offline")) == "offline"
