"""The paper's ten benchmarks as files in the layouts their authors publish, with the tests' own
records: what ``eval.local_tasks`` reads and ``eval.fetch_benchmarks`` writes.

The layouts are facts about the published files (folder and file names, JSON keys, CSV columns,
label files); the questions are made up here, a few per split, with the features the converters
must handle: numeric ARC labels, an answer key with a leading space (OpenBookQA), a Winogrande
record without an answer (skipped, as upstream's test split), aliases with surrounding spaces
(TriviaQA), a question with a comma and quotes in a CSV cell (MMLU).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

# requests per benchmark that lm-eval builds from these records zero-shot (documents x choices)
REQUESTS = {"hellaswag": 3 * 4, "gsm8k": 5, "triviaqa": 4, "mmlu": 3 * 3 * 4}
MMLU_SUBJECTS = ("abstract_algebra", "astronomy", "high_school_physics")


def _jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _labelled(folder: Path, split: str, records: list[tuple[dict, object]]) -> None:
    """PIQA's and SIQA's layout: ``split.jsonl`` and one label a line in ``split-labels.lst``."""
    _jsonl(folder / f"{split}.jsonl", [r for r, _ in records])
    (folder / f"{split}-labels.lst").write_text("".join(f"{y}\n" for _, y in records))


def _stem(stem: str, texts: list[str], labels: str | list[str] = "ABCDE", **extra) -> dict:
    """ARC's, CommonsenseQA's and OpenBookQA's question: a stem and labelled choices."""
    choices = [{"text": t, "label": label} for t, label in zip(texts, labels, strict=False)]
    return {"stem": stem, "choices": choices, **extra}


def write_piqa(root: Path) -> None:
    folder = root / "piqa" / "physicaliqa-train-dev"
    _labelled(
        folder,
        "train",
        [
            ({"goal": "Keep bread fresh", "sol1": "Seal it in a bag.", "sol2": "Wet it."}, 0),
            ({"goal": "Dry wet shoes", "sol1": "Freeze them.", "sol2": "Stuff with paper."}, 1),
            ({"goal": "Light a room", "sol1": "Open the curtains.", "sol2": "Close the door."}, 0),
        ],
    )
    _labelled(
        folder,
        "dev",
        [
            ({"goal": "Open a jar", "sol1": "Tap the lid.", "sol2": "Paint the lid."}, 0),
            ({"goal": "Cool soup fast", "sol1": "Cover it.", "sol2": "Stir it in a cold bath."}, 1),
            ({"goal": "Sharpen a pencil", "sol1": "Use a knife.", "sol2": "Use a spoon."}, 0),
        ],
    )


def write_winogrande(root: Path) -> None:
    folder = root / "winogrande" / "winogrande_1.1"

    def item(qid, sentence, option1, option2, answer):
        return {
            "qID": qid,
            "sentence": sentence,
            "option1": option1,
            "option2": option2,
            "answer": answer,
        }

    _jsonl(
        folder / "train_xl.jsonl",
        [
            item("t1", "The cup fell off the shelf because _ was full.", "cup", "shelf", "2"),
            item("t2", "Anna lent Maria a pen because _ had two.", "Anna", "Maria", "1"),
            item("t3", "The dog chased the cat until _ was tired.", "dog", "cat", "1"),
        ],
    )
    _jsonl(
        folder / "dev.jsonl",
        [
            item("d1", "The trophy did not fit in the case as _ was small.", "trophy", "case", "2"),
            item("d2", "Tom called Sam since _ needed help.", "Tom", "Sam", "1"),
            item("d3", "The ice melted on the road because _ was warm.", "ice", "road", "2"),
        ],
    )
    _jsonl(folder / "test.jsonl", [item("x1", "Kim thanked Lee as _ was kind.", "Kim", "Lee", "")])


def write_arc(root: Path) -> None:
    for name, offset in (("ARC-Easy", 0), ("ARC-Challenge", 10)):
        folder = root / "ai2_arc" / name / "ARC-V1-Feb2018-2" / name
        questions = [
            ("What do plants need to make food?", ["sunlight", "sand", "noise", "rocks"], "A"),
            ("Which is a liquid at room temperature?", ["iron", "water", "salt"], "B"),
            ("Which planet is closest to the Sun?", ["Mars", "Venus", "Mercury", "Earth"], "3"),
            ("What force pulls objects to Earth?", ["magnetism", "friction", "gravity"], "C"),
            ("Which tool measures mass?", ["balance", "ruler", "thermometer", "clock"], "1"),
            ("Water freezes at what Celsius?", ["0", "50", "100", "-50"], "A"),
            ("Which animal lays eggs?", ["dog", "chicken", "cat", "horse"], "B"),
        ]
        records = []
        for i, (stem, texts, key) in enumerate(questions):
            labels = "1234" if key.isdigit() else "ABCD"
            records.append(
                {
                    "id": f"{name}_{offset + i}",
                    "question": _stem(stem, texts, labels),
                    "answerKey": key,
                }
            )
        for split, part in (("Train", records[:3]), ("Dev", records[3:5]), ("Test", records[5:])):
            _jsonl(folder / f"{name}-{split}.jsonl", part)


def write_hellaswag(root: Path) -> None:
    folder = root / "hellaswag"

    def item(ind, label, ctx_a, ctx_b, endings, split):
        return {
            "ind": ind,
            "activity_label": "Cooking",
            "ctx_a": ctx_a,
            "ctx_b": ctx_b,
            "ctx": f"{ctx_a} {ctx_b}",
            "split": split,
            "split_type": "indomain",
            "label": label,
            "endings": endings,
            "source_id": f"activitynet~v_{ind}",
        }

    endings = ["adds salt.", "reads a book.", "stirs the pot.", "paints the wall."]
    _jsonl(
        folder / "hellaswag_train.jsonl",
        [
            item(1, 0, "A man boils water.", "he", endings, "train"),
            item(5, 2, "A boy mixes batter.", "he", endings, "train"),
            item(6, 0, "A girl cuts bread.", "she", endings, "train"),
        ],
    )
    _jsonl(
        folder / "hellaswag_val.jsonl",
        [
            item(2, 2, "A woman chops onions.", "she", endings, "val"),
            item(3, 0, "A chef tastes the sauce.", "the chef", endings, "val"),
        ],
    )


def write_commonsense_qa(root: Path) -> None:
    folder = root / "commonsense_qa"
    texts = ["library", "ocean", "desert", "kitchen", "garage"]

    def item(qid, stem, concept, key):
        question = _stem(stem, texts, question_concept=concept)
        return {"answerKey": key, "id": qid, "question": question}

    _jsonl(
        folder / "train_rand_split.jsonl",
        [
            item("c1", "Where would you find many books?", "books", "A"),
            item("c4", "Where is sand found in dunes?", "sand", "C"),
            item("c5", "Where are meals cooked?", "meals", "D"),
        ],
    )
    _jsonl(
        folder / "dev_rand_split.jsonl",
        [
            item("c2", "Where do whales live?", "whales", "B"),
            item("c3", "Where is a car usually kept?", "car", "E"),
        ],
    )


def write_siqa(root: Path) -> None:
    folder = root / "social_i_qa" / "socialiqa-train-dev"

    def item(context, question, a, b, c):
        return {"context": context, "question": question, "answerA": a, "answerB": b, "answerC": c}

    _labelled(
        folder,
        "train",
        [
            (item("Jo won the race.", "How does Jo feel?", "sad", "proud", "bored"), "2"),
            (item("Cy lost a key.", "What will Cy do next?", "look for it", "sing", "eat"), "1"),
            (item("Di was tired.", "What does Di need?", "a race", "a test", "sleep"), "3"),
        ],
    )
    _labelled(
        folder,
        "dev",
        [
            (item("Ali forgot lunch.", "What will Ali do?", "buy food", "sleep", "run"), "1"),
            (
                item(
                    "Bo helped a friend.",
                    "Why did Bo do this?",
                    "to be mean",
                    "to nap",
                    "to be kind",
                ),
                "3",
            ),
        ],
    )


def write_mmlu(root: Path) -> None:
    """MMLU's ``data/{dev,val,test}/<subject>_<split>.csv``: no header; question, four options,
    the answer's letter."""
    rows = {
        "abstract_algebra": [
            ["How many elements does Z_6 have?", "3", "6", "12", "36", "B"],
            ['Is the group "Z_2 x Z_2", with 4 elements, cyclic?', "yes", "no", "both", "-", "B"],
            ["The order of 2 in Z_5 is", "1", "2", "4", "5", "C"],
        ],
        "astronomy": [
            ["What is the Sun?", "a planet", "a star", "a moon", "a comet", "B"],
            ["Which planet has rings?", "Saturn", "Mercury", "Venus", "Mars", "A"],
            ["Light from the Sun takes about", "8 s", "8 min", "8 h", "8 days", "B"],
        ],
        "high_school_physics": [
            ["Unit of force?", "joule", "watt", "newton", "pascal", "C"],
            ["Speed of light is about", "3e8 m/s", "3e5 m/s", "340 m/s", "1 m/s", "A"],
            ["Momentum is", "m/v", "mv", "mv^2", "m+v", "B"],
        ],
    }
    for subject, questions in rows.items():
        for split, part in (("dev", questions[:2]), ("val", questions[2:]), ("test", questions)):
            path = root / "hendrycks_test" / "data" / split / f"{subject}_{split}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="") as f:
                csv.writer(f).writerows(part)


def write_openbookqa(root: Path) -> None:
    folder = root / "openbookqa" / "OpenBookQA-V1-Sep2018" / "Data" / "Main"
    texts = ["evaporation", "a rock", "the moon", "a shadow"]
    records = [
        {"id": f"o{i}", "question": _stem(stem, texts), "answerKey": key}
        for i, (stem, key) in enumerate(
            [
                ("Puddles dry up because of", "A"),
                ("What orbits the Earth?", " C"),
                ("Blocking light makes", "D"),
                ("Which is hard and does not grow?", "B"),
                ("Water turning to vapour is", "A"),
                ("A tree in sunlight casts", "D"),
            ]
        )
    ]
    for split, part in (("train", records[3:]), ("dev", records[1:3]), ("test", records[:1])):
        _jsonl(folder / f"{split}.jsonl", part)


def write_triviaqa(root: Path) -> None:
    """TriviaQA's ``qa/<domain>-<split>.json``: one JSON object whose ``Data`` holds the
    questions."""
    folder = root / "trivia_qa" / "rc.nocontext" / "qa"
    folder.mkdir(parents=True, exist_ok=True)

    def item(qid, question, value, aliases):
        answer = {"Aliases": aliases, "Value": value, "Type": "WikipediaEntity"}
        return {"Question": question, "QuestionId": qid, "Answer": answer}

    files = {
        "web-train.json": [
            item("w1", "Which ocean is the largest", "Pacific", ["Pacific"]),
            item("w4", "What colour is the sky on a clear day", "Blue", ["Blue"]),
        ],
        "web-dev.json": [
            item("w2", "What is the capital of France", "Paris", ["Paris", " paris "]),
            item("w3", "Which metal is liquid at room temperature", "Mercury", ["Mercury"]),
        ],
        "wikipedia-train.json": [item("k1", "Who wrote Hamlet", "Shakespeare", ["Shakespeare"])],
        "wikipedia-dev.json": [
            item("k2", "What gas do plants absorb", "Carbon dioxide", ["CO2", "Carbon dioxide"]),
            item("k3", "How many legs has a spider", "Eight", ["8", "eight"]),
        ],
    }
    for name, data in files.items():
        domain = name.split("-")[0]
        (folder / name).write_text(json.dumps({"Data": data, "Domain": domain, "Version": 1.0}))


def write_gsm8k(root: Path) -> None:
    """GSM8K's ``{train,test}.jsonl``: a question and a worked answer ending ``#### N``."""

    def item(question, steps, number):
        return {"question": question, "answer": f"{steps}\n#### {number}"}

    problems = [
        item("Ann has 3 apples and buys 4 more. How many?", "3 + 4 = <<3+4=7>>7", 7),
        item("A box holds 6 eggs. How many in 5 boxes?", "6 * 5 = <<6*5=30>>30", 30),
        item("Tom had $20 and spent $8. How much is left?", "20 - 8 = <<20-8=12>>12", 12),
        item("12 cookies shared by 4 kids. How many each?", "12 / 4 = <<12/4=3>>3", 3),
        item("A train goes 60 km an hour for 2 hours. How far?", "60 * 2 = <<60*2=120>>120", 120),
        item("Sue reads 10 pages a day for 7 days. Pages?", "10 * 7 = <<10*7=70>>70", 70),
    ]
    _jsonl(root / "gsm8k" / "train.jsonl", problems[1:])
    _jsonl(root / "gsm8k" / "test.jsonl", problems[:5])


WRITERS = (
    write_piqa,
    write_winogrande,
    write_arc,
    write_hellaswag,
    write_commonsense_qa,
    write_siqa,
    write_mmlu,
    write_openbookqa,
    write_triviaqa,
    write_gsm8k,
)


def write_benchmarks(root: Path) -> Path:
    """Every benchmark under ``root``, each in its published layout; returns ``root``."""
    for write in WRITERS:
        write(root)
    return root


def benchmark_files() -> Path:
    """A directory of every benchmark's files, made once (``data_fixtures.made_once``)."""
    from data_fixtures import made_once

    return made_once("benchmarks", write_benchmarks)
