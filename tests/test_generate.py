"""Decoding with a KV cache: the same numbers as recomputing the prefix, transformers' greedy
``generate`` token for token, and ``python -m eval.generate`` on a trained run."""

import json

import pytest
import torch

from data_fixtures import write_parquet_corpus
from eval.generate import main as generate_cli
from model import Llama, ModelConfig
from model.kv_cache import KVCache
from model.sampling import (
    GREEDY,
    SamplingConfig,
    document_start,
    filter_logits,
    generate,
    next_token,
)
from train_helpers import run_in_process, tiny_overrides

VOCAB = 96


def random_model(activation: str, max_seq_len: int = 64, dtype=torch.float64, **overrides) -> Llama:
    """A small model whose weights (alphas included) are away from their initial values, so
    that greedy decoding does not just repeat the last token as a fresh model does."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        gated_hidden=64,
        max_seq_len=max_seq_len,
        activation=activation,
        **overrides,
    )
    model = Llama(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def prompts(*lengths: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize(
    ("activation", "overrides"), [("xielu", {}), ("swiglu", {}), ("xielu", {"n_kv_heads": 2})]
)
def test_cached_decoding_gives_the_logits_of_recomputing_the_prefix(activation, overrides):
    model = random_model(activation, **overrides)
    tokens = torch.randint(0, VOCAB, (3, 40))
    cache = KVCache.for_model(model, batch=3)
    with torch.no_grad():
        full = model(tokens)
        # a prefill, a one-token step, a multi-token chunk, then one token at a time
        pieces = [model(tokens[:, :12], cache=cache), model(tokens[:, 12:13], cache=cache)]
        pieces.append(model(tokens[:, 13:25], cache=cache))
        pieces += [model(tokens[:, i : i + 1], cache=cache) for i in range(25, 40)]
    assert cache.length == 40
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-12)


def test_the_cache_refuses_positions_past_its_capacity():
    model = random_model("xielu", max_seq_len=16)
    cache = KVCache.for_model(model, batch=1, capacity=10)
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="holds 8 of 10 positions; 3 more"):
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="context of 16"):
        KVCache.for_model(model, batch=1, capacity=17)


@pytest.mark.parametrize(
    "activation,hf_class,overrides",
    [
        ("swiglu", "LlamaForCausalLM", {}),
        ("xielu", "ArceeForCausalLM", {}),
        ("relu2", "ArceeForCausalLM", {}),
        ("swiglu", "LlamaForCausalLM", {"n_kv_heads": 1}),  # its cache holds one head
    ],
)
def test_greedy_decoding_equals_transformers_generate(activation, hf_class, overrides):
    from model.hf import to_hf_model

    model = random_model(activation, **overrides)
    hf = to_hf_model(model)
    assert type(hf).__name__ == hf_class
    # to_hf_model casts after building: Arcee's xIELU scalars are float64 here, not bf16
    assert all(p.dtype == torch.float64 for p in hf.parameters())
    batch = prompts(9, 9)
    ours = generate(model, batch, max_new_tokens=20)
    with torch.no_grad():
        inputs = torch.tensor(batch)
        theirs = hf.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),  # else it masks the ids equal to pad_token_id
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
        )
    assert [g.tokens for g in ours] == theirs[:, 9:].tolist()
    assert len(set(ours[0].tokens)) > 3, "a degenerate model would make this test vacuous"


def test_prompts_of_different_lengths_decode_together_as_they_would_alone():
    model = random_model("xielu")
    batch = prompts(3, 11, 7)
    together = generate(model, batch, max_new_tokens=12)
    alone = [generate(model, [p], max_new_tokens=12)[0] for p in batch]
    assert together == alone


@pytest.mark.parametrize(("prompt_length", "max_new"), [(4, 5), (10, 50)])
def test_in_lockstep_a_finished_process_keeps_calling_the_model_until_every_one_is_done(
    prompt_length, max_new
):
    """Several processes under FSDP2: each forward is a collective. The others are done after
    3 more forwards here; (10, 50) ends at the context, where the cache has no room left."""
    model = random_model("xielu", max_seq_len=16)
    (alone,) = generate(model, prompts(prompt_length), max_new_tokens=max_new)
    calls, asked = [], []
    forward = model.forward
    model.forward = lambda tokens, *a, **k: calls.append(tokens.shape) or forward(tokens, *a, **k)
    others_going = iter([True, True, True, False])

    def lockstep(done: bool) -> bool:
        asked.append(done)
        return done and not next(others_going)

    (stepped,) = generate(model, prompts(prompt_length), max_new, lockstep=lockstep)
    assert stepped == alone
    decoded = len(alone.tokens)
    assert asked == [False] * (decoded - 1) + [True] * 4
    assert len(calls) == 1 + (decoded - 1) + 3 and calls[-3:] == [(1, 1)] * 3


def test_in_lockstep_nothing_to_generate_still_runs_the_first_forward_and_waits():
    model = random_model("xielu", max_seq_len=16)
    calls = []
    forward = model.forward
    model.forward = lambda tokens, *a, **k: calls.append(tokens.shape) or forward(tokens, *a, **k)
    others_going = iter([True, False])
    (nothing,) = generate(model, prompts(4), 0, lockstep=lambda done: not next(others_going))
    assert nothing.tokens == [] and nothing.finish_reason == "max_new_tokens"
    assert calls == [(1, 4), (1, 1)]  # the prefill the others run, then one in step
    assert generate(model, prompts(4), 0)[0] == nothing and len(calls) == 2  # alone: none


def test_a_prompt_longer_than_the_context_is_an_error_naming_the_lengths():
    model = random_model("xielu", max_seq_len=16)
    with pytest.raises(ValueError, match=r"prompt 1 has 20 tokens.*max_seq_len\) is 16 tokens"):
        generate(model, prompts(5, 20), max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        generate(model, [[]], max_new_tokens=4)


def test_decoding_stops_at_eos_at_max_new_tokens_and_at_the_context():
    model = random_model("xielu", max_seq_len=16)
    (free,) = generate(model, prompts(4), max_new_tokens=8)
    eos = free.tokens[3]
    (stopped,) = generate(model, prompts(4), max_new_tokens=8, eos_id=eos)
    assert stopped.finish_reason == "eos"
    assert stopped.tokens == free.tokens[: free.tokens.index(eos)]
    assert free.finish_reason == "max_new_tokens" and len(free.tokens) == 8
    (full,) = generate(model, prompts(10), max_new_tokens=50)
    assert full.finish_reason == "context" and len(full.tokens) == 16 - 10


def test_seeded_sampling_is_reproducible():
    model = random_model("xielu")
    sampling = SamplingConfig(temperature=1.0, top_k=20, top_p=0.9)
    first = generate(model, prompts(5, 8), 15, sampling, seed=7)
    assert generate(model, prompts(5, 8), 15, sampling, seed=7) == first
    assert generate(model, prompts(5, 8), 15, sampling, seed=8) != first


def test_top_k_of_one_is_greedy():
    model = random_model("swiglu")
    greedy = generate(model, prompts(6, 6), 15, GREEDY)
    top1 = generate(model, prompts(6, 6), 15, SamplingConfig(temperature=1.5, top_k=1), seed=0)
    assert top1 == greedy


def test_top_p_keeps_the_smallest_set_of_likeliest_tokens_reaching_p():
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    kept = lambda p: filter_logits(logits, SamplingConfig(top_p=p)).isfinite()[0].tolist()  # noqa: E731
    assert kept(0.5) == [False, True, False, False]
    assert kept(0.8) == [False, True, False, True]
    assert kept(0.81) == [False, True, True, True]
    assert kept(1.0) == [True, True, True, True]
    top2 = filter_logits(logits, SamplingConfig(top_k=2)).isfinite()[0].tolist()
    assert top2 == [False, True, False, True]


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_divides_the_logits_before_top_p_and_sampling(temperature):
    """Sampling at temperature T draws from softmax(logits / T): the filtered logits are
    logits / T, top-p ranks the tempered probabilities, and the draws' frequencies follow them."""
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()
    tempered = filter_logits(logits, SamplingConfig(temperature=temperature))
    torch.testing.assert_close(tempered, logits / temperature)
    # p = 0.7: at T = 1 the two likeliest (0.5, 0.3) reach it; at T = 2 the tempered
    # probabilities (0.38, 0.29, 0.21, 0.12) need three, at T = 0.5 one (0.69) does not
    kept = filter_logits(logits, SamplingConfig(temperature=temperature, top_p=0.7)).isfinite()
    expected = {0.5: [False, True, False, True], 2.0: [False, True, True, True]}[temperature]
    assert kept[0].tolist() == expected
    generator = torch.Generator().manual_seed(0)
    draws = next_token(logits.expand(20000, 4), SamplingConfig(temperature=temperature), generator)
    frequencies = torch.bincount(draws, minlength=4) / 20000
    expected_probabilities = (logits / temperature).softmax(-1)[0]
    torch.testing.assert_close(frequencies, expected_probabilities, atol=0.01, rtol=0)


def test_padding_ids_past_the_tokenizers_vocabulary_are_never_drawn():
    model = random_model("xielu")
    with torch.no_grad():
        model.lm_head.weight[50:] += 10.0  # make the "padding" rows the likeliest
    out = generate(model, prompts(5), 10, SamplingConfig(temperature=2.0), seed=0, vocab_limit=50)
    assert max(out[0].tokens) < 50


def test_sampling_options_are_checked():
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=1.5)
    assert SamplingConfig(top_p=1).top_p == 1
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)


def test_a_prompt_starts_where_training_saw_documents_start():
    """After the EOS that ended the previous document, then the BOS a run that adds one saw."""
    assert document_start([7, 8], eos_id=0) == [0, 7, 8]
    assert document_start([7, 8], eos_id=0, bos_id=1) == [0, 1, 7, 8]


# ---- python -m eval.generate on a trained run ----------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus")
    write_parquet_corpus(corpus, files=2, row_group_size=30)
    run_dir = tmp_path_factory.mktemp("run")
    overrides = tiny_overrides(
        corpus,
        run_dir,
        **{"data.tokenizer.name": "bytes", "trainer.steps": 6, "validation.every": 6},
    )
    assert run_in_process(overrides) == 0
    return run_dir


@pytest.mark.slow
@pytest.mark.mutation
def test_eval_generate_samples_from_a_run(run_dir, tmp_path, capsys):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("The\n\nA second one\nthird\n")
    args = [str(run_dir), "--prompt", "Hello", "--prompts-file", str(prompts_file)]
    args += ["--max-new-tokens", "6", "--device", "cpu", "--batch-size", "2", "--json"]
    records = generate_cli(args)
    assert [r["prompt"] for r in records] == ["Hello", "The", "A second one", "third"]
    for record in records:
        assert record["finish_reason"] in ("eos", "max_new_tokens", "context")
        assert 0 <= record["new_tokens"] <= 6 and isinstance(record["completion"], str)
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == records
    assert "4 prompt(s)" in err and "step 6" in err
    # the same seed, the same text; greedy by --temperature 0
    assert generate_cli(args) == records
    capsys.readouterr()
    generate_cli([str(run_dir), "--prompt", "Hi", "--temperature", "0", "--max-new-tokens", "3"])
    out, _ = capsys.readouterr()
    assert out.startswith("--- ") and "\nHi" in out


def test_eval_generate_refuses_a_prompt_longer_than_the_context(run_dir):
    with pytest.raises(SystemExit, match=r"prompt 0 has 41 tokens.*is 32 tokens"):
        generate_cli([str(run_dir), "--prompt", "x" * 40, "--device", "cpu"])
