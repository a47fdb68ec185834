"""The per-layer gradient norms a run logged, by step (tests/test_grad_norms.py and the
distributed tests read them)."""

from train_helpers import metrics


def norms(run_dir) -> dict[int, dict[str, float]]:
    return {
        m["step"]: {k: v for k, v in m.items() if k.startswith("grad_norm/")}
        for m in metrics(run_dir)
        if any(k.startswith("grad_norm/") for k in m)
    }
