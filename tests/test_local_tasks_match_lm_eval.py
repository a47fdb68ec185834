"""Every local task (``eval/local_tasks.py``) is lm-eval's own task of the same name.

lm-eval's task definitions (``lm_eval/tasks/<task>/*.yaml`` and their ``utils.py`` functions) are
read offline and given, in place of their Hugging Face dataset, the same upstream records as the
local task, mapped here into the layout of that dataset (``TO_HF``: each mapping names the field
correspondences). Every other key of lm-eval's config is kept, ``process_docs`` included. Then:

* the requests both tasks build, for every document, are equal string for string (context and
  continuation, or context and generation arguments), zero-shot, at the task's configured
  few-shot count (GSM8K's 5), and one-shot, from lm-eval's few-shot split (all but MMLU's);
* the scores of a fixed fake model (log-likelihoods from a hash of the request, generations of
  the right answer in several formats or a wrong one) are equal, metric by metric and filter by
  filter, per document and in aggregate;
* the documented differences (MMLU's structure and pinned zero-shot, GSM8K's extra filter name)
  are asserted as exactly those.

The benchmark files are the tests' own (``tests/benchmark_fixtures.py``) and, where
``../shared/data`` is beside the repository, the real upstream excerpts there too; each is copied
with a WikiHow-style HellaSwag record added, for lm-eval's clean-up of ``[title]``/``[step]``
markers to remove.
"""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from lm_eval import simple_evaluate
from lm_eval.api.group import Group
from lm_eval.api.model import LM
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml

from benchmark_fixtures import REQUESTS, write_benchmarks
from data_fixtures import SHARED
from eval.local_tasks import build_local_tasks
from hf_layouts import (
    LM_EVAL_TASKS,
    NAMES,
    TO_HF,
    gsm8k_hf,
    mmlu_subject_hf,
    mmlu_subjects,
    one,
    triviaqa_hf,
)

SEED = 1234  # simple_evaluate's default fewshot_random_seed

# a WikiHow record, in HellaSwag's upstream layout, with the markers lm-eval's process_docs removes
WIKIHOW = {
    "ind": 4,
    "activity_label": "Home and Garden",
    "ctx_a": "[header] How to clean a grill [title] Heat the grill.",
    "ctx_b": "[step] scrub the  grates",
    "ctx": "",
    "split": "val",
    "split_type": "zeroshot",
    "label": 2,
    "endings": [
        "with a brush. [substeps] Rinse  them.",
        "[title] Let it cool  down.",
        "while the grill is still warm. [title] Oil the grates.",
        "with foil.",
    ],
    "source_id": "wikihow~1",
}


def official_task(yaml_path: Path, splits: dict) -> ConfigurableTask:
    """lm-eval's task from its own YAML, every key kept but the dataset's location: the mapped
    records stand in for the Hub download (``custom_dataset``)."""
    config = load_yaml(yaml_path)
    for key in ("dataset_path", "dataset_name", "dataset_kwargs"):
        config.pop(key, None)
    data = DatasetDict({s: Dataset.from_list(rows) for s, rows in splits.items()})
    return ConfigurableTask(config={**config, "custom_dataset": lambda **_: data})


def official_mmlu(root: Path) -> tuple[Group, list[ConfigurableTask]]:
    """lm-eval's ``mmlu`` group (``mmlu/default``): its four category groups, each with the
    per-subject tasks tagged for it, for every subject in the excerpts."""
    default = LM_EVAL_TASKS / "mmlu" / "default"
    subjects = mmlu_subjects(root)
    tasks = [official_task(default / f"mmlu_{s}.yaml", mmlu_subject_hf(root, s)) for s in subjects]
    top = Group.from_config(load_yaml(default / "_mmlu.yaml"))
    for category in load_yaml(default / "_mmlu.yaml")["task"]:
        config = load_yaml(default / f"_{category}.yaml")
        group = Group.from_config(config)
        for task in tasks:
            if task.config.tag in config["task"]:
                group.add(task)
        top.add(group)
    assert sum(len(list(g)) for g in top) == len(tasks)
    return top, tasks


# the real excerpts' requests per benchmark, zero-shot (documents x choices)
EXCERPT_REQUESTS = {"hellaswag": 4 * 3, "gsm8k": 5, "triviaqa": 4, "mmlu": 4 * 266}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("written", id="tests-own-records"),
        pytest.param("excerpts", id="shared-excerpts", marks=pytest.mark.shared_data),
    ],
)
def source(request, tmp_path_factory):
    """(the benchmark directory, its requests per benchmark): the tests' own records, or the
    real upstream excerpts of ../shared/data; with the WikiHow record added to HellaSwag."""
    src = tmp_path_factory.mktemp("eval") / "benchmarks"
    if request.param == "written":
        write_benchmarks(src)
        expected = REQUESTS
    else:
        shutil.copytree(SHARED / "eval" / "benchmark_excerpts", src)
        expected = EXCERPT_REQUESTS
    val = one(src, "hellaswag/**/hellaswag_val.jsonl")
    val.write_text(val.read_text().rstrip("\n") + "\n" + json.dumps(WIKIHOW) + "\n")
    return src, expected


def load_pairs(source: Path, tmp_path: Path) -> tuple[dict, TaskManager]:
    """{name: (the local task, lm-eval's task, or for mmlu (group, subject tasks))}, fresh."""
    out = tmp_path / "tasks"
    assert set(build_local_tasks(source, out)) == {f"local_{n}" for n in NAMES}
    manager = TaskManager(include_path=str(out), include_defaults=False)
    local = manager.load([f"local_{n}" for n in NAMES])["tasks"]
    pairs = {
        name: (local[f"local_{name}"], official_task(LM_EVAL_TASKS / path, to_hf(source)))
        for name, (path, to_hf) in TO_HF.items()
    }
    pairs["mmlu"] = (local["local_mmlu"], official_mmlu(source))
    return pairs, manager


def requests(task, shots: int) -> list[tuple]:
    task.set_config(key="num_fewshot", value=shots)
    task.set_fewshot_seed(seed=SEED)
    task.build_all_requests(limit=None, rank=0, world_size=1)
    return [(i.request_type, i.idx, i.arguments) for i in task.instances]


@pytest.mark.slow
def test_every_request_equals_lm_evals_string_for_string(source, tmp_path):
    source, expected_requests = source
    pairs, _ = load_pairs(source, tmp_path)
    differ, compared = [], {}
    for name, (local, official) in pairs.items():
        if name == "mmlu":  # the paper's zero-shot, to which the local task is pinned
            _, subjects = official
            expected = [r for task in subjects for r in requests(task, 0)]
            differ += [(name, 0)] if requests(local, 0) != expected else []
            compared[name] = len(expected)
            continue
        configured = official.config.num_fewshot or 0  # GSM8K's 5, the others' 0
        for shots in sorted({0, configured, 1}):
            expected = requests(official, shots)
            differ += [(name, shots)] if requests(local, shots) != expected else []
        compared[name] = len(expected)
    assert not differ, f"not lm-eval's: {differ}"
    # every document of every benchmark, the WikiHow one included
    assert {name: compared[name] for name in expected_requests} == expected_requests


# the YAML keys that decide what is asked and how it is scored, besides the prompt strings
KEYS = (
    "output_type",
    "target_delimiter",
    "fewshot_delimiter",
    "generation_kwargs",
    "metric_list",
    "repeats",
    "training_split",
    "validation_split",
    "test_split",
    "fewshot_split",
)


@pytest.mark.slow
def test_delimiters_splits_generation_filters_and_metrics_are_lm_evals(source, tmp_path):
    source, _ = source
    pairs, _ = load_pairs(source, tmp_path)
    differ = []
    for name, (local, official) in pairs.items():
        keys, filters = KEYS, local.config.filter_list
        if name == "mmlu":  # documented: one task pinned to zero-shot, a description per question
            official = official[1][0]  # each subject's own few-shot split, "dev"
            documented = (local.config.num_fewshot, official.config.num_fewshot) == (0, None)
            documented &= local.config.description == "{{description}}"
            differ += [] if documented else [(name, "num_fewshot/description")]
            keys = [k for k in KEYS if k != "fewshot_split"]
        elif local.config.num_fewshot != official.config.num_fewshot:
            differ.append((name, "num_fewshot"))
        differ += [(name, k) for k in keys if local.config[k] != official.config[k]]
        differ += [(name, "filter_list")] if filters != official.config.filter_list else []
        differ += [(name, "version")] if local.VERSION != official.VERSION else []
    assert not differ, f"not lm-eval's: {differ}"


def digest(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode()).digest()[:8], "big")


class FakeLM(LM):
    """Fixed, deterministic answers from the request's strings alone: a log-likelihood and a
    greedy flag from a hash of (context, continuation); as a generation, ``answers[the context's
    last question]`` (or a wrong answer), so that the filters and the metric decide the score."""

    def __init__(self, answers: dict[str, str]):
        super().__init__()
        self.answers = answers

    def loglikelihood(self, requests, disable_tqdm=False):
        scores = [digest(*r.args) for r in requests]
        return [(-(h % 100_000) / 1000, h % 3 == 0) for h in scores]

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def generate_until(self, requests, disable_tqdm=False):
        return [
            self.answers.get(r.args[0].rsplit("\n\n", 1)[-1], " I don't know") for r in requests
        ]


def generations(source: Path) -> dict[str, str]:
    """The fake model's generation for each question's prompt (lm-eval's): the right answer in
    one of several formats, or a wrong one, in turn."""
    answers = {}
    for i, doc in enumerate(triviaqa_hf(source)["validation"]):
        alias = doc["answer"]["aliases"][-1]
        formats = [f" {alias}", f" {alias.upper()}!", f"\n {alias}", f" {alias} and more", " Oslo"]
        answers[f"Question: {doc['question']}?\nAnswer:"] = formats[i % len(formats)]
    for i, doc in enumerate(gsm8k_hf(source)["test"]):
        number = doc["answer"].split("####")[-1].strip()
        formats = [
            f" {doc['answer']}",  # strict-match and flexible-extract right
            f" The answer is ${number}.",  # flexible-extract right
            f" #### {number}0",
            f" {number}\n\nQuestion: 1",
            " I don't know",
        ]
        answers[f"Question: {doc['question']}\nAnswer:"] = formats[i % len(formats)]
    return answers


def per_doc(samples: list[dict], filters: set[str]) -> list[tuple]:
    """What lm-eval logged of each document under each filter: the requests, the model's answers
    before and after the filter, and every metric."""
    return [
        (s["filter"], s["arguments"], s["resps"], s["filtered_resps"], [s[m] for m in s["metrics"]])
        for s in samples
        if s["filter"] in filters
    ]


@pytest.mark.slow
def test_a_fixed_fake_model_scores_the_same_on_both(source, tmp_path):
    source, _ = source
    pairs, manager = load_pairs(source, tmp_path)
    local = [task for task, _ in pairs.values()]
    official = [task for name, (_, task) in pairs.items() if name != "mmlu"]
    mmlu_group, mmlu_subjects = pairs["mmlu"][1]
    out = simple_evaluate(
        model=FakeLM(generations(source)),
        tasks=[*local, *official, mmlu_group],
        task_manager=manager,
        log_samples=True,
    )
    results, samples = out["results"], out["samples"]

    def metrics(task: str) -> dict:
        return {k: v for k, v in results[task].items() if k not in ("alias", "name")}

    differ = []
    for name in TO_HF:
        got, expected = metrics(f"local_{name}"), metrics(name)
        filters = {f["name"] for f in pairs[name][1].config.filter_list or [{"name": "none"}]}
        expected_docs = per_doc(samples[name], filters)
        assert expected_docs, name
        if got != expected or per_doc(samples[f"local_{name}"], filters) != expected_docs:
            differ.append(name)
    # MMLU: per question, then the group's size-weighted mean over categories and subjects
    subjects = [s for task in mmlu_subjects for s in samples[task.task_name]]
    if per_doc(samples["local_mmlu"], {"none"}) != per_doc(subjects, {"none"}) or (
        results["local_mmlu"]["acc,none"] != pytest.approx(results["mmlu"]["acc,none"], 1e-12)
    ):
        differ.append("mmlu")
    assert not differ, f"not lm-eval's: {differ}"
    # not a degenerate model: some right, some wrong, and the filters change the outcome
    assert 0 < results["local_triviaqa"]["exact_match,remove_whitespace"] < 1
    strict, flexible = (
        results["local_gsm8k"][f"exact_match,{f}"] for f in ("strict-match", "flexible-extract")
    )
    assert 0 < strict < flexible < 1
    assert 0 < results["local_mmlu"]["acc,none"] < 1
