"""Profiles of chosen steps on CPU; the CUDA memory snapshot is never touched there."""

import json

import pytest
import torch

from train_helpers import run_in_process, tiny_overrides


@pytest.mark.slow
@pytest.mark.mutation
def test_profile_steps_write_a_chrome_trace_of_those_steps_and_touch_no_cuda(
    corpus, tmp_path, monkeypatch
):
    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU run touched the CUDA memory recorder")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", no_cuda)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", no_cuda)
    overrides = tiny_overrides(corpus, tmp_path, **{"profile.steps": "[3,4]"})
    assert run_in_process(overrides) == 0
    (trace,) = (tmp_path / "profile").iterdir()
    assert trace.name == "trace_rank00000_steps3-4.json"
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::mm" in names  # the step's matmuls
    steps = sorted(n for n in names if n and n.startswith("train step"))
    assert steps == ["train step 3", "train step 4"]  # those steps, nothing before or after


@pytest.mark.parametrize("steps", ["[0,2]", "[5,4]", "[3]", "[11,13]"])
def test_profile_steps_outside_the_run_are_refused_naming_the_key(corpus, tmp_path, steps):
    overrides = tiny_overrides(corpus, tmp_path, **{"profile.steps": steps})
    with pytest.raises(ValueError, match=r"profile\.steps="):
        run_in_process(overrides)
