"""Each step is recorded once: a resume supersedes what the interrupted attempt logged past it.

The end-to-end tier and the run directory's property test check this through whole runs; here
the rule itself, on a ``metrics.jsonl`` written by hand, and what wandb is sent.
"""

import json

from training.instruments.metrics import (
    SUPERSEDED_FILE,
    MetricsLogger,
    WandbConfig,
    supersede_records_after,
)


def write_records(path, steps, partial: bool = False) -> None:
    lines = [json.dumps({"step": s, "loss": float(s)}) for s in steps]
    text = "\n".join(lines) + "\n"
    if partial:
        text += '{"step": 9, "lo'  # a kill while the line was written
    path.write_text(text)


def steps_in(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_resume_keeps_the_records_up_to_its_step_and_moves_the_rest_aside(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_records(path, [0, 1, 2, 3, 4, 4, 5, 6], partial=True)
    assert supersede_records_after(path, 4) == 6
    assert steps_in(path) == [0, 1, 2, 3, 4, 4]  # step 4's records were logged before its save
    aside = (tmp_path / SUPERSEDED_FILE).read_text().splitlines()
    assert json.loads(aside[0]) == {"superseded_at_resume_from": 4}
    assert [json.loads(line)["step"] for line in aside[1:3]] == [5, 6]
    assert aside[3] == '{"step": 9, "lo'


def test_a_fresh_start_supersedes_everything_and_nothing_is_a_no_op(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert supersede_records_after(path, None) is None  # no file yet
    write_records(path, [0, 1, 2])
    assert supersede_records_after(path, None) == 2
    assert path.read_text() == ""
    write_records(path, [1, 2])
    before = path.read_text()
    assert supersede_records_after(path, 2) == 2 and path.read_text() == before
    aside = (tmp_path / SUPERSEDED_FILE).read_text().splitlines()
    assert [json.loads(line).get("step") for line in aside] == [None, 0, 1, 2]


class FakeWandb:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def log(self, metrics, step):
        self.steps.append(step)


def test_wandb_is_not_sent_again_the_steps_it_has(tmp_path):
    write_records(tmp_path / "metrics.jsonl", [1, 2, 3, 4, 5])
    logger = MetricsLogger(tmp_path, WandbConfig(mode="disabled"), {}, "run", resumed_at=3)
    logger.wandb = FakeWandb()
    for step in (4, 5, 6):
        logger.log(step, {"loss": 1.0}, console=False)
    logger.wandb, wandb = None, logger.wandb
    logger.close()
    assert wandb.steps == [6]  # it has 4 and 5 from the first attempt
    assert steps_in(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]
