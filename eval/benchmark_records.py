"""The benchmarks' upstream files as the documents lm-eval's own tasks read.

Each converter reads one benchmark in the layout its authors publish, under a folder named for
the benchmark (as ``python -m eval.fetch_benchmarks DIR`` writes them), and returns ``{split:
rows}``, every row with lm-eval's rendered prompt (``query``), ``choices`` and ``gold``
(``answers``/``answer`` for the generative tasks), read the way the Hugging Face datasets lm-eval
downloads were built from the same files (the same splits, record order and stripped fields).
``eval.local_tasks`` writes them out with lm-eval's task settings.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable
from pathlib import Path

LETTERS = "ABCDE"
QUESTION_ANSWER = "Question: {}\nAnswer:"

Splits = dict[str, list[dict]]

# the folder each lm-eval task's files sit in, under the directory the local suite is built
# from (the converters below read there), and the benchmarks' folders those make
TASK_FOLDERS = {
    "piqa": "piqa",
    "winogrande": "winogrande",
    "arc_easy": "ai2_arc/ARC-Easy",
    "arc_challenge": "ai2_arc/ARC-Challenge",
    "hellaswag": "hellaswag",
    "commonsense_qa": "commonsense_qa",
    "social_iqa": "social_i_qa",
    "mmlu": "hendrycks_test",
    "openbookqa": "openbookqa",
    "triviaqa": "trivia_qa",
    "gsm8k": "gsm8k",
}
BENCHMARK_FOLDERS = tuple(dict.fromkeys(f.split("/")[0] for f in TASK_FOLDERS.values()))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _find(root: Path, pattern: str) -> list[Path]:
    return sorted(root.glob(pattern))


def _with_labels(root: Path, pattern: str) -> list[tuple[dict, str]]:
    """The PIQA / SIQA layout: ``X.jsonl`` records and their labels in ``X-labels.lst``."""
    out = []
    for data in _find(root, pattern):
        labels = (data.parent / f"{data.stem}-labels.lst").read_text().split()
        out += list(zip(_jsonl(data), labels, strict=False))
    return out


def piqa(root: Path) -> Splits:
    """lm-eval ``piqa``: ``Question: {goal}\\nAnswer:``, choices ``[sol1, sol2]``."""

    def rows(split: str) -> list[dict]:
        return [
            {
                "query": QUESTION_ANSWER.format(doc["goal"]),
                "choices": [doc["sol1"], doc["sol2"]],
                "gold": int(label),
            }
            for doc, label in _with_labels(root, f"piqa/**/{split}.jsonl")
        ]

    return {"train": rows("train"), "validation": rows("dev")}


def winogrande(root: Path) -> Splits:
    """lm-eval ``winogrande`` (partial scoring): one context per option, the sentence up to the
    blank with the option filled in, each scored on the same continuation, the rest of the
    sentence after the blank (stripped) behind the target delimiter ``" "``. ``gold`` as
    ``doc_to_text`` (an int) is what makes lm-eval put the choices in the contexts."""

    def rows(pattern: str) -> list[dict]:
        out = []
        for data in _find(root, pattern):
            for doc in _jsonl(data):
                if doc.get("answer") not in ("1", "2"):
                    continue
                blank = doc["sentence"].index("_")
                out.append(
                    {
                        "choices": [
                            doc["sentence"][:blank] + doc[k] for k in ("option1", "option2")
                        ],
                        "target": doc["sentence"][blank + 1 :].strip(),
                        "gold": int(doc["answer"]) - 1,
                    }
                )
        return out

    return {
        "train": rows("winogrande/**/train_xl.jsonl"),
        "validation": rows("winogrande/**/dev.jsonl"),
    }


def _stem_rows(root: Path, pattern: str, render: Callable[[dict], dict]) -> list[dict]:
    """The ARC / CommonsenseQA / OpenBookQA layout: a question stem with labelled choices."""
    return [
        render(doc)
        for data in _find(root, pattern)
        for doc in _jsonl(data)
        if doc.get("answerKey", "").strip()
    ]


def arc(root: Path, name: str) -> Splits:
    """lm-eval ``arc_easy``/``arc_challenge``: ``Question: {question}\\nAnswer:``, the choices'
    texts, the gold the position of ``answerKey`` among the labels."""

    def render(doc: dict) -> dict:
        labels = [c["label"] for c in doc["question"]["choices"]]
        return {
            "query": QUESTION_ANSWER.format(doc["question"]["stem"]),
            "choices": [c["text"] for c in doc["question"]["choices"]],
            "gold": labels.index(doc["answerKey"]),
        }

    path = f"ai2_arc/{name}/**/{name}-{{}}.jsonl"
    return {
        split: _stem_rows(root, path.format(upstream), render)
        for split, upstream in (("train", "Train"), ("validation", "Dev"), ("test", "Test"))
    }


def commonsense_qa(root: Path) -> Splits:
    """lm-eval ``commonsense_qa``: the stripped question, then the five choices lettered A-E in
    their order, then ``Answer:``; the choices are the letters, the gold ``answerKey``'s."""

    def render(doc: dict) -> dict:
        texts = [c["text"] for c in doc["question"]["choices"]]
        lines = [f"Question: {doc['question']['stem'].strip()}"]
        lines += [f"{LETTERS[i]}. {texts[i]}" for i in range(5)]
        return {
            "query": "\n".join([*lines, "Answer:"]),
            "choices": list(LETTERS),
            "gold": LETTERS.index(doc["answerKey"]),
        }

    return {
        "train": _stem_rows(root, "commonsense_qa/**/train_rand_split.jsonl", render),
        "validation": _stem_rows(root, "commonsense_qa/**/dev_rand_split.jsonl", render),
    }


def openbookqa(root: Path) -> Splits:
    """lm-eval ``openbookqa``: the bare question stem, the choices' texts."""

    def render(doc: dict) -> dict:
        labels = [c["label"] for c in doc["question"]["choices"]]
        return {
            "query": doc["question"]["stem"],
            "choices": [c["text"] for c in doc["question"]["choices"]],
            "gold": labels.index(doc["answerKey"].lstrip()),
        }

    return {
        split: _stem_rows(root, f"openbookqa/**/Main/{upstream}.jsonl", render)
        for split, upstream in (("train", "train"), ("validation", "dev"), ("test", "test"))
    }


def _hellaswag_clean(text: str) -> str:
    """lm-eval's ``hellaswag/utils.py`` ``preprocess``: WikiHow's ``[title]``/``[step]`` markers."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag(root: Path) -> Splits:
    """lm-eval ``hellaswag`` (its ``process_docs``): ``{activity_label}: {ctx_a} {Ctx_b}`` and the
    endings, each cleaned of WikiHow's bracketed markers."""

    def rows(split: str) -> list[dict]:
        out = []
        for data in _find(root, f"hellaswag/**/hellaswag_{split}.jsonl"):
            for doc in _jsonl(data):
                ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
                out.append(
                    {
                        "query": _hellaswag_clean(doc["activity_label"] + ": " + ctx),
                        "choices": [_hellaswag_clean(e) for e in doc["endings"]],
                        "gold": int(doc["label"]),
                    }
                )
        return out

    return {"train": rows("train"), "validation": rows("val")}


def siqa(root: Path) -> Splits:
    """lm-eval ``social_iqa``: ``Q: {context} {question}\\nA:``, the three answers."""

    def rows(split: str) -> list[dict]:
        return [
            {
                "query": f"Q: {doc['context']} {doc['question']}\nA:",
                "choices": [doc["answerA"], doc["answerB"], doc["answerC"]],
                "gold": int(label) - 1,
            }
            for doc, label in _with_labels(root, f"social_i_qa/**/{split}.jsonl")
        ]

    return {"train": rows("train"), "validation": rows("dev")}


def mmlu(root: Path) -> Splits:
    """lm-eval ``mmlu`` (``mmlu/default``): the subject's description, then the stripped question,
    the four choices lettered A-D and ``Answer:``; the choices are the letters.

    Differs from lm-eval in its structure only: one task over all subjects (lm-eval's ``mmlu`` is
    a group of per-subject tasks whose size-weighted mean, the number reported, is this task's
    mean) whose ``num_fewshot`` is pinned to 0, since few-shot examples come from each subject's
    own ``dev`` split in lm-eval (see the module's docstring)."""
    rows = []
    for data in _find(root, "hendrycks_test/**/test/*_test.csv"):
        subject = data.name.removesuffix("_test.csv")
        description = (
            "The following are multiple choice questions (with answers) about "
            f"{' '.join(subject.split('_'))}.\n\n"
        )
        with data.open(newline="") as f:
            for record in csv.reader(f):
                question, options, answer = record[0], record[1:5], record[5]
                lines = [question.strip()]
                lines += [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)]
                rows.append(
                    {
                        "query": "\n".join([*lines, "Answer:"]),
                        "choices": list(LETTERS[:4]),
                        "gold": LETTERS.index(answer.strip()),
                        "description": description,
                    }
                )
    return {"test": rows}


def triviaqa(root: Path) -> Splits:
    """lm-eval ``triviaqa`` (``rc.nocontext``): ``Question: {question}?\\nAnswer:``, every alias a
    correct answer. As the Hugging Face dataset: a split is every ``*-dev.json``/``*-train.json``
    of the ``qa`` folder in name order, questions and aliases stripped."""

    def rows(pattern: str) -> list[dict]:
        return [
            {
                "query": f"Question: {doc['Question'].strip()}?\nAnswer:",
                "answers": [a.strip() for a in doc["Answer"]["Aliases"]],
            }
            for data in _find(root, f"trivia_qa/rc.nocontext/**/{pattern}")
            for doc in json.loads(data.read_text())["Data"]
            if "Answer" in doc
        ]

    return {"train": rows("*-train.json"), "validation": rows("*-dev.json")}


def gsm8k(root: Path) -> Splits:
    """lm-eval ``gsm8k``: ``Question: {question}\\nAnswer:``, the whole worked solution as target
    (its ``#### N`` is what the metric compares). A split is every ``{split}.jsonl`` under
    ``gsm8k/`` (the published ``train.jsonl`` / ``test.jsonl``; the socratic variant's files are
    named otherwise)."""

    def rows(split: str) -> list[dict]:
        return [
            {"query": QUESTION_ANSWER.format(d["question"]), "answer": d["answer"]}
            for path in _find(root, f"gsm8k/**/{split}.jsonl")
            for d in _jsonl(path)
        ]

    return {"train": rows("train"), "test": rows("test")}
