"""The paper's downstream suite as lm-eval tasks over local files (for machines with no Hub).

``build_local_tasks(source_dir, out_dir)`` converts benchmark records in their upstream layouts
(as in ``../shared/data/eval``: PIQA, Winogrande, ARC-Easy/Challenge, HellaSwag, CommonsenseQA,
SIQA, MMLU, OpenBookQA, TriviaQA, GSM8K) into jsonl files and writes one lm-eval task YAML per
benchmark (``dataset_path: json`` with ``data_files``), loadable through
``TaskManager(include_path=out_dir)``. Prompts follow lm-eval's own task definitions where that
is a plain template; Winogrande is scored on the whole sentence with each option substituted
(lm-eval scores only the part after the blank).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

LETTERS = "ABCDE"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _find(root: Path, pattern: str) -> list[Path]:
    return sorted(root.glob(pattern))


def _piqa(root: Path) -> list[dict]:
    rows = []
    for data in _find(root, "piqa/**/dev.jsonl"):
        labels = (data.parent / "dev-labels.lst").read_text().split()
        for doc, label in zip(_jsonl(data), labels, strict=False):
            q = f"Question: {doc['goal']}\nAnswer:"
            rows.append({"query": q, "choices": [doc["sol1"], doc["sol2"]], "gold": int(label)})
    return rows


def _hellaswag(root: Path) -> list[dict]:
    rows = []
    for data in _find(root, "hellaswag/**/hellaswag_val.jsonl"):
        for doc in _jsonl(data):
            ctx = f"{doc['ctx_a']} {doc['ctx_b'].capitalize()}".strip()
            rows.append(
                {
                    "query": f"{doc['activity_label']}: {ctx}",
                    "choices": doc["endings"],
                    "gold": int(doc["label"]),
                }
            )
    return rows


def _stem_choices(root: Path, pattern: str, template: str) -> list[dict]:
    """The ARC / CommonsenseQA / OpenBookQA layout: a question stem with labelled choices."""
    rows = []
    for data in _find(root, pattern):
        for doc in _jsonl(data):
            if "answerKey" not in doc:
                continue
            labels = [c["label"] for c in doc["question"]["choices"]]
            rows.append(
                {
                    "query": template.format(doc["question"]["stem"]),
                    "choices": [c["text"] for c in doc["question"]["choices"]],
                    "gold": labels.index(doc["answerKey"]),
                }
            )
    return rows


def _siqa(root: Path) -> list[dict]:
    rows = []
    for data in _find(root, "social_i_qa/**/dev.jsonl"):
        labels = (data.parent / "dev-labels.lst").read_text().split()
        for doc, label in zip(_jsonl(data), labels, strict=False):
            rows.append(
                {
                    "query": f"Q: {doc['context']} {doc['question']}\nA:",
                    "choices": [doc["answerA"], doc["answerB"], doc["answerC"]],
                    "gold": int(label) - 1,
                }
            )
    return rows


def _winogrande(root: Path) -> list[dict]:
    rows = []
    for data in _find(root, "winogrande/**/dev.jsonl"):
        for doc in _jsonl(data):
            options = [doc["sentence"].replace("_", doc[k]) for k in ("option1", "option2")]
            rows.append({"query": "", "choices": options, "gold": int(doc["answer"]) - 1})
    return rows


def _mmlu(root: Path) -> list[dict]:
    rows = []
    for data in _find(root, "hendrycks_test/**/test/*_test.csv"):
        subject = data.name.removesuffix("_test.csv").replace("_", " ")
        with data.open(newline="") as f:
            for question, *options, answer in csv.reader(f):
                lines = [f"The following is a question about {subject}.", question.strip()]
                lines += [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)]
                rows.append(
                    {
                        "query": "\n".join([*lines, "Answer:"]),
                        "choices": list(LETTERS[: len(options)]),
                        "gold": LETTERS.index(answer.strip()),
                    }
                )
    return rows


def _triviaqa(root: Path) -> list[dict]:
    rows = []
    for data in _find(root, "trivia_qa/rc.nocontext/**/wikipedia-dev.json"):
        for doc in json.loads(data.read_text())["Data"]:
            rows.append(
                {
                    "question": f"Question: {doc['Question']}?\nAnswer:",
                    "answers": doc["Answer"]["Aliases"],
                }
            )
    return rows


def _gsm8k(root: Path) -> list[dict]:
    candidates = [root.parent / "gsm8k" / "test.jsonl", *_find(root, "gsm8k/main/**/test.jsonl")]
    for path in candidates:
        if path.is_file():
            return [
                {
                    "question": f"Question: {d['question']}\nAnswer:",
                    "answer": d["answer"].split("####")[-1].strip().replace(",", ""),
                }
                for d in _jsonl(path)
            ]
    return []


QUESTION_ANSWER = "Question: {}\nAnswer:"
ARC_TEST = "ai2_arc/{0}/**/{0}-Test.jsonl"

MULTIPLE_CHOICE: dict[str, Callable[[Path], list[dict]]] = {
    "piqa": _piqa,
    "winogrande": _winogrande,
    "arc_easy": lambda r: _stem_choices(r, ARC_TEST.format("ARC-Easy"), QUESTION_ANSWER),
    "arc_challenge": lambda r: _stem_choices(r, ARC_TEST.format("ARC-Challenge"), QUESTION_ANSWER),
    "hellaswag": _hellaswag,
    "commonsense_qa": lambda r: _stem_choices(
        r, "commonsense_qa/**/dev_rand_split.jsonl", QUESTION_ANSWER
    ),
    "social_iqa": _siqa,
    "mmlu": _mmlu,
    "openbookqa": lambda r: _stem_choices(r, "openbookqa/**/Main/test.jsonl", "{}"),
}

MC_TEMPLATE = """task: local_{name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
target_delimiter: "{delimiter}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""

GEN_TEMPLATE = """task: local_{name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{target}"
generation_kwargs:
  until: {until}
  do_sample: false
  max_gen_toks: {max_tokens}
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
{filters}"""

# lm-eval's triviaqa: the answer the model generates (" Paris", the space is the continuation's)
# is stripped before the exact match, and the first of the filtered answers is scored
TRIVIAQA_FILTER = """filter_list:
  - name: remove_whitespace
    filter:
      - function: remove_whitespace
      - function: take_first
"""

GSM8K_FILTER = """filter_list:
  - name: last-number
    filter:
      - function: regex
        regex_pattern: "(-?[$0-9.,]{2,})|(-?[0-9]+)"
        group_select: -1
      - function: take_first
"""


def build_local_tasks(source: str | Path, out_dir: str | Path) -> list[str]:
    """Write jsonl data and task YAMLs for every benchmark found; return the task names."""
    source, out_dir = Path(source), Path(out_dir)
    root = source / "benchmark_excerpts" if (source / "benchmark_excerpts").is_dir() else source
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []

    def write(name: str, rows: list[dict], yaml_text: str) -> None:
        if not rows:
            return
        data = out_dir / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (out_dir / f"local_{name}.yaml").write_text(yaml_text.replace("@DATA@", str(data)))
        names.append(f"local_{name}")

    for name, convert in MULTIPLE_CHOICE.items():
        delimiter = "" if name == "winogrande" else " "
        write(
            name, convert(root), MC_TEMPLATE.format(name=name, data="@DATA@", delimiter=delimiter)
        )
    write(
        "triviaqa",
        _triviaqa(root),
        GEN_TEMPLATE.format(
            name="triviaqa",
            data="@DATA@",
            target="{{answers}}",
            until='["\\n", ".", ","]',
            max_tokens=32,
            filters=TRIVIAQA_FILTER,
        ),
    )
    write(
        "gsm8k",
        _gsm8k(root),
        GEN_TEMPLATE.format(
            name="gsm8k",
            data="@DATA@",
            target="{{answer}}",
            until='["Question:", "\\n\\n"]',
            max_tokens=256,
            filters=GSM8K_FILTER,
        ),
    )
    return names
