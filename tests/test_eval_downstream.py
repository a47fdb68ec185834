"""lm-eval through the project's model: the adapter's numbers, and the local paper suite."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmark_fixtures import benchmark_files
from data import TokenizerConfig, load_tokenizer
from data_fixtures import SHARED
from eval.downstream import PAPER_SUITE, table
from eval.harness import ProjectLM
from eval.local_tasks import build_local_tasks
from model import Llama, ModelConfig


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    tokenizer = load_tokenizer(TokenizerConfig("llama3"))
    config = ModelConfig(
        vocab_size=128256, dim=32, n_layers=2, n_heads=2, gated_hidden=64, max_seq_len=64
    )
    return ProjectLM(Llama(config), tokenizer, batch_size=3)


def request(*args):
    return SimpleNamespace(args=args)


def test_loglikelihood_is_the_sum_of_the_continuations_log_probabilities(lm):
    context, continuation = "The capital of France is", " Paris, of course"
    ((score, greedy),) = lm.loglikelihood([request(context, continuation)])
    ctx = [lm.tokenizer.eos_id, *lm.tokenizer.encode(context)]
    cont = lm.tokenizer.encode(continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logprobs = torch.log_softmax(lm.model.double()(ids[:, :-1]), -1)[0]
    lm.model.float()
    expected = sum(float(logprobs[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))
    assert score == pytest.approx(expected, rel=1e-4)
    assert isinstance(greedy, bool)


def test_batched_and_single_requests_agree_and_long_contexts_are_truncated(lm):
    requests = [request("a" * n, " b") for n in (1, 30, 400)]  # the last exceeds 64 tokens
    batched = lm.loglikelihood(requests)
    single = [lm.loglikelihood([r])[0] for r in requests]
    for (a, _), (b, _) in zip(batched, single, strict=True):
        assert a == pytest.approx(b, rel=1e-5) and math.isfinite(a)


def byte_level_hf_tokenizer():
    """A transformers tokenizer, built in memory, that gives the ``bytes`` tokenizer's ids:
    GPT-2's byte-to-character map with no merges, so each UTF-8 byte is its own token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    vocab.update({"<bos>": 256, "<eos>": 257})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>")


ROLLING_TEXT = "Naïve café owners — 42 of them — met at 9:30.\n\tThe quick brown fox jumps. "


@pytest.mark.slow
def test_rolling_loglikelihood_equals_lm_evals_own_hugging_face_model():
    """lm-eval's HFLM is the reference implementation of rolling windows (every token a target
    exactly once, each window conditioned on the tokens before it up to the model's length), so
    the adapter must reproduce its per-document totals on the same network and token ids.

    Like for like: the adapter precedes the first window with EOS, HFLM with BOS unless told
    otherwise, so HFLM is given ``prefix_token_id=EOS``. The documents are 4 windows and a part
    long, one window, one window plus a token, two windows, and shorter than a window."""
    from lm_eval.models.huggingface import HFLM

    from model.hf import to_hf_model

    tokenizer = load_tokenizer(TokenizerConfig("bytes"))
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        dim=32,
        n_layers=2,
        n_heads=2,
        gated_hidden=64,
        max_seq_len=64,
    )
    model = Llama(config).eval()
    with torch.no_grad():  # away from the initialisation, so that the context matters
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    project = ProjectLM(model, tokenizer, batch_size=3)
    hf_tokenizer = byte_level_hf_tokenizer()
    hf_model = to_hf_model(model, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id)
    reference = HFLM(
        pretrained=hf_model,
        tokenizer=hf_tokenizer,
        device="cpu",
        batch_size=4,
        prefix_token_id=tokenizer.eos_id,
    )
    docs = [
        (ROLLING_TEXT * 4)[:-40],
        "x" * 64,
        "y" * 65,
        "abcdefgh" * 16,
        "short",
    ]
    lengths = [len(tokenizer.encode(d)) for d in docs]
    assert lengths[0] > 3 * 64 and lengths[0] % 64 and lengths[1:] == [64, 65, 128, 5]
    assert [hf_tokenizer.encode(d) for d in docs] == [tokenizer.encode(d) for d in docs]
    assert reference.max_length == project.max_length == 64
    requests = [request(d) for d in docs]
    expected = reference.loglikelihood_rolling(requests, disable_tqdm=True)
    assert project.loglikelihood_rolling(requests) == pytest.approx(expected, rel=1e-5)


def test_generation_stops_at_the_until_string(lm):
    (out,) = lm.generate_until(
        [request("Question: 1+1?\nAnswer:", {"until": ["\n"], "max_gen_toks": 5})]
    )
    assert "\n" not in out and isinstance(out, str)


def test_local_suite_covers_the_papers_ten_benchmarks(tmp_path):
    names = build_local_tasks(benchmark_files(), tmp_path)
    expected = {f"local_{t}" for rows in PAPER_SUITE.values() for t, _ in rows}
    assert set(names) == expected
    assert (tmp_path / "gsm8k.jsonl").read_text().count("\n") == 5  # benchmark_fixtures


@pytest.mark.shared_data
def test_the_full_gsm8k_test_split_put_in_place_of_the_excerpt_is_the_one_evaluated(tmp_path):
    """The real excerpts, with GSM8K's folder holding the whole published test split (1319
    problems) instead: the split evaluated is the whole one."""
    source = tmp_path / "benchmarks"
    excerpts = SHARED / "eval" / "benchmark_excerpts"
    for folder in excerpts.iterdir():
        if folder.name != "gsm8k":
            (source / folder.name).parent.mkdir(parents=True, exist_ok=True)
            (source / folder.name).symlink_to(folder)
    full = source / "gsm8k"
    full.mkdir()
    (full / "test.jsonl").symlink_to(SHARED / "eval" / "gsm8k" / "test.jsonl")
    (full / "train.jsonl").symlink_to(next(excerpts.glob("gsm8k/main/**/train.jsonl")))
    names = build_local_tasks(source, tmp_path / "tasks")
    assert "local_gsm8k" in names
    assert (tmp_path / "tasks" / "gsm8k.jsonl").read_text().count("\n") == 1319


# (task, doc_id) the oracle below answers right; every other document it answers wrong
RIGHT = {
    ("local_piqa", 0),
    ("local_piqa", 1),
    ("local_arc_easy", 0),
    ("local_arc_easy", 1),
    ("local_arc_challenge", 0),
    ("local_gsm8k", 1),
}


class Oracle(ProjectLM):
    """The project's adapter, run on lm-eval's requests, with its answers then overridden to
    be right exactly on ``RIGHT``: the metrics lm-eval must report are known in advance."""

    def loglikelihood(self, requests):
        scores = super().loglikelihood(requests)
        out = []
        for r, (score, _) in zip(requests, scores, strict=True):
            assert math.isfinite(score) and score <= 0
            choices, gold = r.doc["choices"], r.doc["gold"]
            chosen = gold if (r.task_name, r.doc_id) in RIGHT else (gold + 1) % len(choices)
            # every other choice far below, even per byte (acc_norm)
            out.append((score - (0 if r.idx == chosen else 1e9), False))
        return out

    def generate_until(self, requests):
        short = [request(r.args[0], {**r.args[1], "max_gen_toks": 2}) for r in requests]
        assert all(isinstance(text, str) for text in super().generate_until(short))
        answers = [r.doc["answer"] for r in requests]
        right = [(r.task_name, r.doc_id) in RIGHT for r in requests]
        return [f" so {a}" if ok else f" so {a}1" for a, ok in zip(answers, right, strict=True)]


@pytest.mark.slow
def test_lm_eval_reports_a_model_of_known_accuracy_and_the_table_averages_rows(lm, tmp_path):
    """The table's numbers are what the paper reports, so they are checked against values known
    without lm-eval or ``table``: the oracle's accuracies, and the paper's aggregate (percent,
    averaged within a row, then unweighted over the rows)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    build_local_tasks(benchmark_files(), tmp_path)
    oracle = Oracle(lm.model, lm.tokenizer, batch_size=3)
    tasks = sorted({task for task, _ in RIGHT} | {"local_winogrande"})
    # only the local tasks: indexing lm-eval's thousands of built-in YAMLs takes seconds
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out = simple_evaluate(model=oracle, tasks=tasks, limit=2, task_manager=manager)
    results = out["results"]
    reported = {
        task: results[task][key]
        for task, key in [
            ("local_piqa", "acc,none"),
            ("local_arc_easy", "acc_norm,none"),
            ("local_arc_challenge", "acc_norm,none"),
            ("local_winogrande", "acc,none"),
            ("local_gsm8k", "exact_match,flexible-extract"),
        ]
    }
    assert reported == {
        "local_piqa": 1.0,
        "local_arc_easy": 1.0,
        "local_arc_challenge": 0.5,
        "local_winogrande": 0.0,
        "local_gsm8k": 0.5,
    }
    rows = {
        "PIQA": [("local_piqa", "acc")],
        "ARC": [("local_arc_easy", "acc_norm"), ("local_arc_challenge", "acc_norm")],
        "Winogrande": [("local_winogrande", "acc")],
        "GSM8k": [("local_gsm8k", "exact_match")],
    }
    lines, aggregate = table(results, rows)
    assert aggregate == pytest.approx((100 + 75 + 0 + 50) / 4)  # not (1 + 1 + .5 + 0 + .5) / 5
    assert lines == [
        "| benchmark | accuracy |",
        "|---|---|",
        "| PIQA | 100.0 |",
        "| ARC | 75.0 |",
        "| Winogrande | 0.0 |",
        "| GSM8k | 50.0 |",
        "| Aggregate Score | 56.2 |",
    ]


def test_generation_with_the_cache_equals_recomputing_the_prefix_each_token(lm):
    contexts = ["Question: 2+2?\nAnswer:", "The capital of France is", "a b c"]
    requests = [request(c, {"until": ["\n\n"], "max_gen_toks": 8}) for c in contexts]
    expected = []
    for context in contexts:  # the plain greedy loop the cache replaces
        ids, new = lm._context_ids(context), []
        for _ in range(8):
            with torch.no_grad():
                token = int(
                    lm.model(torch.tensor([ids + new]))[0, -1, : lm.tokenizer.vocab_size].argmax()
                )
            if token == lm.tokenizer.eos_id:
                break
            new.append(token)
            if "\n\n" in lm.tokenizer.decode(new):
                break
        expected.append(lm.tokenizer.decode(new).split("\n\n")[0])
    assert lm.generate_until(requests) == expected


def test_downstream_runs_the_model_on_the_device_and_batch_size_it_is_given(lm, monkeypatch):
    import lm_eval.evaluator
    import lm_eval.tasks

    import training.checkpoint
    from eval.downstream import main as downstream

    seen = {}
    config = SimpleNamespace(data=SimpleNamespace(tokenizer=TokenizerConfig("llama3")))

    def load_trained_model(run_dir, step=None, device="cpu"):
        seen["loaded_on"] = device
        return lm.model, config, 7

    def simple_evaluate(model, tasks, **kwargs):
        seen["adapter"] = (model.device, model.batch_size_per_call)
        seen["parameters_on"] = {p.device.type for p in model.model.parameters()}
        return {"results": {"piqa": {"acc,none": 0.5}}}

    monkeypatch.setattr(training.checkpoint, "load_trained_model", load_trained_model)
    monkeypatch.setattr(lm_eval.evaluator, "simple_evaluate", simple_evaluate)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", lambda **kwargs: None)
    out = downstream(["RUN", "--tasks", "piqa", "--device", "cpu", "--batch-size", "4"])
    assert seen == {
        "loaded_on": "cpu",
        "adapter": (torch.device("cpu"), 4),
        "parameters_on": {"cpu"},
    }
    assert out["aggregate"] == pytest.approx(50.0)
    downstream(["RUN", "--tasks", "piqa"])
    assert seen["loaded_on"] == ("cuda" if torch.cuda.is_available() else "cpu")


class AnswersWithTheFirstAlias(ProjectLM):
    """Generates what a correct model would: a space, then the answer (the space belongs to
    the continuation's first token, as BPE encodes it)."""

    def generate_until(self, requests):
        return [" " + r.doc["answers"][0] for r in requests]


@pytest.mark.slow
def test_local_triviaqa_scores_a_correct_answer_with_its_leading_space_as_correct(lm, tmp_path):
    """lm-eval's triviaqa strips the generation (remove_whitespace, take_first) before the
    exact match; without that filter a correct " Paris" scores 0."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    build_local_tasks(benchmark_files(), tmp_path)
    model = AnswersWithTheFirstAlias(lm.model, lm.tokenizer, batch_size=3)
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out = simple_evaluate(model=model, tasks=["local_triviaqa"], limit=3, task_manager=manager)
    from eval.downstream import metric_value

    assert metric_value(out["results"], "local_triviaqa", "exact_match") == 1.0
    assert "exact_match,remove_whitespace" in out["results"]["local_triviaqa"]  # lm-eval's name


@pytest.mark.parametrize("add_bos", [False, True])
def test_a_context_is_preceded_by_what_precedes_a_packed_training_document(add_bos):
    """Training with data.tokenizer.add_bos=true packs ``... EOS BOS text``; a context scored
    after EOS alone is one the model never saw a document start with."""
    from data.tokenizers import encode_document

    tokenizer = load_tokenizer(TokenizerConfig("bytes"))
    packed = np.concatenate(
        [encode_document(tokenizer, t, add_bos) for t in ("first document", "ab")]
    )
    start = len(packed) - len(tokenizer.encode("ab")) - 1  # where "ab" begins, before its EOS
    config = ModelConfig(vocab_size=384, dim=16, n_layers=1, n_heads=2, gated_hidden=32)
    lm = ProjectLM(Llama(config), tokenizer, batch_size=2, add_bos=add_bos)
    seen = []
    forward = lm.model.forward
    lm.model.forward = lambda tokens, *a, **k: (
        seen.append(tokens.clone()) or forward(tokens, *a, **k)
    )
    lm.loglikelihood([request("ab", "c")])
    lm.loglikelihood_rolling(
        [
            request(
                "ab",
            )
        ]
    )
    before = packed[start - (2 if add_bos else 1) : start].tolist()  # EOS of the first, [BOS]
    for tokens in seen:
        assert tokens[0, : len(before)].tolist() == before
        assert tokens[0, len(before)].item() == tokenizer.encode("ab")[0]  # then the text
