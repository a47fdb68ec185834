"""Write the paper's ten benchmarks from the Hugging Face Hub into a directory, once, in the
layouts their authors publish: what the offline suite reads on compute nodes without the Hub.

    python -m eval.fetch_benchmarks /path/to/benchmarks          # where the Hub is reachable
    python -m eval.downstream RUN --suite local --local-data /path/to/benchmarks
    python train.py ... downstream.every=1000 downstream.data=/path/to/benchmarks

Each benchmark is read from the Hub dataset lm-eval's own task loads (its ``dataset_path`` and
``dataset_name``; MMLU from the ``all`` configuration of the same dataset, one download for its
57 subjects) and written back into the published layout (``eval.benchmark_records`` reads it),
every field lm-eval's prompt uses kept as the Hub has it. A benchmark is written into a hidden
folder and moved into place when complete, so an interrupted fetch leaves no half benchmark; one
already in place is kept unless ``--overwrite``. TriviaQA's Hub splits join the web and
Wikipedia files in that order, so each is written as one ``qa/rc.nocontext-<split>.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from eval.benchmark_records import BENCHMARK_FOLDERS

# (Hub dataset, its configuration, split) -> the split's records
Loader = Callable[[str, str | None, str], Iterable[dict]]
LETTERS = "ABCDEFGH"


def load_split(path: str, name: str | None, split: str) -> Iterable[dict]:
    """One split of a Hub dataset through ``datasets`` (its cache and ``HF_*`` settings)."""
    from datasets import load_dataset

    return load_dataset(path, name, split=split)


def _jsonl(path: Path, records: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _labelled(folder: Path, name: str, rows: list[dict], keys: tuple[str, ...]) -> None:
    """PIQA's and SIQA's layout: ``name.jsonl`` and its labels, one a line, in
    ``name-labels.lst``."""
    _jsonl(folder / f"{name}.jsonl", ({k: r[k] for k in keys} for r in rows))
    (folder / f"{name}-labels.lst").write_text("".join(f"{r['label']}\n" for r in rows))


def _question(stem: str, choices: dict, **extra) -> dict:
    """The Hub's transposed ``choices`` ({"text": [...], "label": [...]}) back into ARC's,
    CommonsenseQA's and OpenBookQA's question: a stem and a list of labelled choices."""
    listed = [
        {"text": t, "label": x} for t, x in zip(choices["text"], choices["label"], strict=True)
    ]
    return {"stem": stem, "choices": listed, **extra}


def piqa(load: Loader, root: Path) -> None:
    folder = root / "physicaliqa-train-dev"
    for split, name in (("train", "train"), ("validation", "dev")):
        _labelled(folder, name, list(load("baber/piqa", None, split)), ("goal", "sol1", "sol2"))


def winogrande(load: Loader, root: Path) -> None:
    keys = ("sentence", "option1", "option2", "answer")
    for split, name in (("train", "train_xl"), ("validation", "dev")):
        rows = load("allenai/winogrande", "winogrande_xl", split)
        _jsonl(root / "winogrande_1.1" / f"{name}.jsonl", ({k: r[k] for k in keys} for r in rows))


def ai2_arc(load: Loader, root: Path) -> None:
    for subset in ("ARC-Easy", "ARC-Challenge"):
        folder = root / subset / "ARC-V1-Feb2018-2" / subset
        for split, name in (("train", "Train"), ("validation", "Dev"), ("test", "Test")):
            records = (
                {
                    "id": r["id"],
                    "question": _question(r["question"], r["choices"]),
                    "answerKey": r["answerKey"],
                }
                for r in load("allenai/ai2_arc", subset, split)
            )
            _jsonl(folder / f"{subset}-{name}.jsonl", records)


def hellaswag(load: Loader, root: Path) -> None:
    keys = ("ind", "activity_label", "ctx_a", "ctx_b", "ctx", "endings", "source_id", "split")
    for split, name in (("train", "train"), ("validation", "val")):
        records = (
            {**{k: r[k] for k in keys}, "split_type": r["split_type"], "label": int(r["label"])}
            for r in load("Rowan/hellaswag", None, split)
        )
        _jsonl(root / f"hellaswag_{name}.jsonl", records)


def commonsense_qa(load: Loader, root: Path) -> None:
    for split, name in (("train", "train"), ("validation", "dev")):
        records = (
            {
                "answerKey": r["answerKey"],
                "id": r["id"],
                "question": _question(
                    r["question"], r["choices"], question_concept=r["question_concept"]
                ),
            }
            for r in load("tau/commonsense_qa", None, split)
        )
        _jsonl(root / f"{name}_rand_split.jsonl", records)


def social_i_qa(load: Loader, root: Path) -> None:
    keys = ("context", "question", "answerA", "answerB", "answerC")
    for split, name in (("train", "train"), ("validation", "dev")):
        rows = list(load("lighteval/siqa", None, split))
        _labelled(root / "socialiqa-train-dev", name, rows, keys)


def hendrycks_test(load: Loader, root: Path) -> None:
    """MMLU's ``data/<split>/<subject>_<split>.csv``: no header; the question, four options and
    the answer's letter (the Hub's ``answer`` is its index)."""
    for split, name in (("test", "test"), ("validation", "val"), ("dev", "dev")):
        by_subject: dict[str, list[list[str]]] = {}
        for r in load("cais/mmlu", "all", split):
            row = [r["question"], *r["choices"], LETTERS[r["answer"]]]
            by_subject.setdefault(r["subject"], []).append(row)
        for subject, rows in by_subject.items():
            path = root / "data" / name / f"{subject}_{name}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("w", newline="", encoding="utf-8") as f:
                csv.writer(f).writerows(rows)


def openbookqa(load: Loader, root: Path) -> None:
    folder = root / "OpenBookQA-V1-Sep2018" / "Data" / "Main"
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        records = (
            {
                "id": r["id"],
                "question": _question(r["question_stem"], r["choices"]),
                "answerKey": r["answerKey"],
            }
            for r in load("allenai/openbookqa", "main", split)
        )
        _jsonl(folder / f"{name}.jsonl", records)


def trivia_qa(load: Loader, root: Path) -> None:
    folder = root / "rc.nocontext" / "qa"
    folder.mkdir(parents=True)
    for split, name in (("train", "train"), ("validation", "dev")):
        data = [
            {
                "Question": r["question"],
                "QuestionId": r["question_id"],
                "Answer": {"Aliases": r["answer"]["aliases"], "Value": r["answer"]["value"]},
            }
            for r in load("mandarjoshi/trivia_qa", "rc.nocontext", split)
        ]
        text = json.dumps({"Data": data, "Domain": "rc.nocontext"}, ensure_ascii=False)
        (folder / f"rc.nocontext-{name}.json").write_text(text, encoding="utf-8")


def gsm8k(load: Loader, root: Path) -> None:
    for split in ("train", "test"):
        rows = load("openai/gsm8k", "main", split)
        _jsonl(
            root / f"{split}.jsonl",
            ({"question": r["question"], "answer": r["answer"]} for r in rows),
        )


# benchmark folder -> what writes it (the Hub datasets it reads are named inside, as in lm-eval)
WRITERS: dict[str, Callable[[Loader, Path], None]] = {
    "piqa": piqa,
    "winogrande": winogrande,
    "ai2_arc": ai2_arc,
    "hellaswag": hellaswag,
    "commonsense_qa": commonsense_qa,
    "social_i_qa": social_i_qa,
    "hendrycks_test": hendrycks_test,
    "openbookqa": openbookqa,
    "trivia_qa": trivia_qa,
    "gsm8k": gsm8k,
}
assert tuple(WRITERS) == BENCHMARK_FOLDERS


def fetch(
    out_dir: str | Path,
    only: Iterable[str] | None = None,
    overwrite: bool = False,
    load: Loader | None = None,
) -> dict[str, str]:
    """Write each benchmark (``only``: those folders) under ``out_dir``, its splits read with
    ``load`` (default ``load_split``, the Hub); returns what happened to each: ``written`` or
    ``kept`` (already there, no ``overwrite``)."""
    load = load or load_split
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done = {}
    for folder in only or BENCHMARK_FOLDERS:
        final = out_dir / folder
        if final.exists() and not overwrite:
            done[folder] = "kept"
            continue
        partial = out_dir / f".{folder}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        WRITERS[folder](load, partial)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        done[folder] = "written"
    return done


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", help="the directory to write (made if missing)")
    parser.add_argument(
        "--only", nargs="+", choices=BENCHMARK_FOLDERS, help="these benchmarks' folders only"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="write again the benchmarks already there"
    )
    args = parser.parse_args(argv)
    done = fetch(args.out_dir, args.only, args.overwrite)
    for folder, what in done.items():
        print(f"{folder}: {what}")
    print(
        f"offline: python -m eval.downstream RUN --suite local --local-data {args.out_dir}, "
        f"or downstream.data={args.out_dir}"
    )
    return done


if __name__ == "__main__":
    main()
