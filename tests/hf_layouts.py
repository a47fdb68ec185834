"""The benchmarks' published layouts mapped into the layouts of the Hugging Face datasets that
lm-eval's tasks load (``TO_HF``, one function per benchmark, each naming the field
correspondences): what the tests hand lm-eval's own tasks in place of a Hub download, and what
they build the Hub's datasets from for ``eval.fetch_benchmarks`` (``hub``, ``Hub``)."""

import csv
import json
from pathlib import Path

import lm_eval
from datasets import Dataset
from lm_eval.tasks._yaml_loader import load_yaml

LM_EVAL_TASKS = Path(lm_eval.__file__).parent / "tasks"


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def one(root: Path, pattern: str) -> Path:
    (path,) = root.glob(pattern)
    return path


def piqa_hf(root: Path) -> dict:
    """baber/piqa (the ``piqa`` builder): ``X.jsonl`` goal/sol1/sol2 as they are, ``label`` the
    int on the same line of ``X-labels.lst``; train <- train, validation <- dev."""

    def split(name):
        data = one(root, f"piqa/**/{name}.jsonl")
        labels = (data.parent / f"{name}-labels.lst").read_text().split()
        return [{**d, "label": int(y)} for d, y in zip(jsonl(data), labels, strict=True)]

    return {"train": split("train"), "validation": split("dev")}


def winogrande_hf(root: Path) -> dict:
    """allenai/winogrande ``winogrande_xl``: sentence/option1/option2/answer ("1"/"2", a string)
    as they are; train <- train_xl.jsonl, validation <- dev.jsonl."""
    keys = ("sentence", "option1", "option2", "answer")
    return {
        split: [{k: d[k] for k in keys} for d in jsonl(one(root, f"winogrande/**/{name}"))]
        for split, name in (("train", "train_xl.jsonl"), ("validation", "dev.jsonl"))
    }


def stem_choices(doc: dict) -> dict:
    """question.choices [{"text", "label"}, ...] -> choices {"text": [...], "label": [...]}."""
    choices = doc["question"]["choices"]
    return {"text": [c["text"] for c in choices], "label": [c["label"] for c in choices]}


def arc_hf(name: str):
    """allenai/ai2_arc ``name``: id, question <- question.stem, choices <- question.choices
    transposed, answerKey; train/validation/test <- -Train/-Dev/-Test.jsonl."""

    def mapping(root: Path) -> dict:
        out = {}
        for split, part in (("train", "Train"), ("validation", "Dev"), ("test", "Test")):
            out[split] = [
                {
                    "id": d["id"],
                    "question": d["question"]["stem"],
                    "choices": stem_choices(d),
                    "answerKey": d["answerKey"],
                }
                for d in jsonl(one(root, f"ai2_arc/{name}/**/{name}-{part}.jsonl"))
            ]
        return out

    return mapping


def hellaswag_hf(root: Path) -> dict:
    """Rowan/hellaswag: every field as it is, ``label`` as a string; train <- hellaswag_train,
    validation <- hellaswag_val."""
    keys = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split")
    return {
        split: [
            {**{k: d[k] for k in keys}, "split_type": d["split_type"], "label": str(d["label"])}
            for d in jsonl(one(root, f"hellaswag/**/hellaswag_{name}.jsonl"))
        ]
        for split, name in (("train", "train"), ("validation", "val"))
    }


def commonsense_qa_hf(root: Path) -> dict:
    """tau/commonsense_qa: id, question <- question.stem, question_concept, choices <-
    question.choices transposed, answerKey; train/validation <- train/dev_rand_split.jsonl."""
    return {
        split: [
            {
                "id": d["id"],
                "question": d["question"]["stem"],
                "question_concept": d["question"]["question_concept"],
                "choices": stem_choices(d),
                "answerKey": d["answerKey"],
            }
            for d in jsonl(one(root, f"commonsense_qa/**/{name}_rand_split.jsonl"))
        ]
        for split, name in (("train", "train"), ("validation", "dev"))
    }


def siqa_hf(root: Path) -> dict:
    """lighteval/siqa: context/question/answerA-C as they are, ``label`` the string ("1"-"3") on
    the same line of ``X-labels.lst``; train <- train, validation <- dev."""

    def split(name):
        data = one(root, f"social_i_qa/**/{name}.jsonl")
        labels = (data.parent / f"{name}-labels.lst").read_text().split()
        return [{**d, "label": y} for d, y in zip(jsonl(data), labels, strict=True)]

    return {"train": split("train"), "validation": split("dev")}


def mmlu_subject_hf(root: Path, subject: str) -> dict:
    """cais/mmlu ``subject``: a csv row (question, A, B, C, D, answer letter) -> question,
    subject, choices <- the four options, answer <- the letter's index; test/validation/dev <-
    test/val/dev."""

    def split(name):
        path = one(root, f"hendrycks_test/**/{name}/{subject}_{name}.csv")
        with path.open(newline="") as f:
            rows = list(csv.reader(f))
        return [
            {"question": r[0], "subject": subject, "choices": r[1:5], "answer": "ABCD".index(r[5])}
            for r in rows
        ]

    return {"test": split("test"), "validation": split("val"), "dev": split("dev")}


def mmlu_all_hf(root: Path) -> dict:
    """cais/mmlu ``all``: every subject's split, the subjects in name order."""
    subjects = [mmlu_subject_hf(root, s) for s in mmlu_subjects(root)]
    return {
        split: [r for s in subjects for r in s[split]] for split in ("test", "validation", "dev")
    }


def openbookqa_hf(root: Path) -> dict:
    """allenai/openbookqa ``main``: id, question_stem <- question.stem, choices <-
    question.choices transposed, answerKey; train/validation/test <- Main/train/dev/test.jsonl."""
    return {
        split: [
            {
                "id": d["id"],
                "question_stem": d["question"]["stem"],
                "choices": stem_choices(d),
                "answerKey": d["answerKey"],
            }
            for d in jsonl(one(root, f"openbookqa/**/Main/{name}.jsonl"))
        ]
        for split, name in (("train", "train"), ("validation", "dev"), ("test", "test"))
    }


def triviaqa_hf(root: Path) -> dict:
    """mandarjoshi/trivia_qa ``rc.nocontext`` (the ``trivia_qa`` builder): a split is every
    ``qa/*-train.json`` / ``qa/*-dev.json`` in sorted order, each ``Data`` entry one record:
    question <- Question stripped, question_id <- QuestionId, answer.aliases <- Answer.Aliases
    each stripped, answer.value <- Answer.Value stripped."""

    def split(pattern):
        files = sorted(root.glob(f"trivia_qa/rc.nocontext/**/qa/{pattern}"))
        return [
            {
                "question": d["Question"].strip(),
                "question_id": d["QuestionId"],
                "answer": {
                    "aliases": [a.strip() for a in d["Answer"]["Aliases"]],
                    "value": d["Answer"]["Value"].strip(),
                },
            }
            for path in files
            for d in json.loads(path.read_text())["Data"]
        ]

    return {"train": split("*-train.json"), "validation": split("*-dev.json")}


def gsm8k_hf(root: Path) -> dict:
    """openai/gsm8k ``main``: question/answer as they are; train/test <- train/test.jsonl."""
    return {split: jsonl(one(root, f"gsm8k/**/{split}.jsonl")) for split in ("train", "test")}


# local task -> (lm-eval's YAML, the mapping of the upstream records into its dataset's layout)
TO_HF = {
    "piqa": ("piqa/piqa.yaml", piqa_hf),
    "winogrande": ("winogrande/default.yaml", winogrande_hf),
    "arc_easy": ("arc/arc_easy.yaml", arc_hf("ARC-Easy")),
    "arc_challenge": ("arc/arc_challenge.yaml", arc_hf("ARC-Challenge")),
    "hellaswag": ("hellaswag/hellaswag.yaml", hellaswag_hf),
    "commonsense_qa": ("commonsense_qa/default.yaml", commonsense_qa_hf),
    "social_iqa": ("siqa/siqa.yaml", siqa_hf),
    "openbookqa": ("openbookqa/openbookqa.yaml", openbookqa_hf),
    "triviaqa": ("triviaqa/default.yaml", triviaqa_hf),
    "gsm8k": ("gsm8k/gsm8k.yaml", gsm8k_hf),
}
NAMES = [*TO_HF, "mmlu"]
MMLU_TESTS = "hendrycks_test/**/test/*_test.csv"


def mmlu_subjects(root: Path) -> list[str]:
    return sorted(p.name.removesuffix("_test.csv") for p in root.glob(MMLU_TESTS))


def hub(root: Path) -> dict:
    """{(dataset, configuration, split): Dataset} as lm-eval's tasks name them, built from the
    benchmark files under ``root``; MMLU's ``all`` configuration of lm-eval's MMLU dataset."""
    out = {}
    for yaml_path, to_hf in TO_HF.values():
        config = load_yaml(LM_EVAL_TASKS / yaml_path)
        for split, rows in to_hf(root).items():
            out[(config["dataset_path"], config.get("dataset_name"), split)] = rows
    mmlu = load_yaml(LM_EVAL_TASKS / "mmlu" / "default" / "_default_template_yaml")
    for split, rows in mmlu_all_hf(root).items():
        out[(mmlu["dataset_path"], "all", split)] = rows
    return {key: Dataset.from_list(rows) for key, rows in out.items()}


class Hub:
    """A stand-in for ``datasets.load_dataset``: what was asked for, and the datasets."""

    def __init__(self, datasets: dict):
        self.datasets, self.asked = datasets, []

    def __call__(self, path: str, name: str | None, split: str):
        self.asked.append((path, name, split))
        return self.datasets[(path, name, split)]
