"""The lm-eval adapter under FSDP2 on 2 gloo ranks whose shares take different numbers of
forwards (longer texts, more requests, longer generations): every forward of a sharded model
is a collective, so a rank that runs fewer would leave the other waiting. The ranks' results
equal one unsharded process's."""

import json
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.slow

TEXT = "The quick brown fox jumps over the lazy dog; the cat watches it from the wall. "


def shares() -> list[dict]:
    """What each rank is asked: rank 1's share takes more forwards of every kind."""
    return [
        {
            "loglikelihood": [("A question?", " yes")],
            "rolling": [TEXT[:20]],
            "generate": [("Once upon", 2)],
        },
        {
            "loglikelihood": [(f"Question {i}?", " no") for i in range(5)],
            "rolling": [TEXT * 2, TEXT, TEXT * 3],
            "generate": [("It was", 12), ("In the", 9), ("We", 12)],
        },
    ]


def answers(lm, share: dict) -> dict:
    def request(*args):
        return SimpleNamespace(args=args)

    generate = [request(c, {"until": ["\n\n"], "max_gen_toks": n}) for c, n in share["generate"]]
    return {
        "loglikelihood": lm.loglikelihood([request(c, x) for c, x in share["loglikelihood"]]),
        "rolling": lm.loglikelihood_rolling([request(t) for t in share["rolling"]]),
        "generate": lm.generate_until(generate),
    }


def tiny_lm(sharded: bool):
    from data import TokenizerConfig, load_tokenizer
    from eval.harness import ProjectLM
    from model import Llama, ModelConfig
    from training.runtime.parallelize import ParallelConfig, apply_fsdp

    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=384, dim=32, n_layers=2, n_heads=2, gated_hidden=64, max_seq_len=64
    )
    model = Llama(config)
    if sharded:
        apply_fsdp(model, ParallelConfig(strategy="fsdp", precision="fp32"))
    return ProjectLM(model, load_tokenizer(TokenizerConfig("bytes")), batch_size=2)


def one_rank(rank: int, tmp: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/rendezvous",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=30),  # a rank left waiting fails the test instead of hanging
    )
    try:
        result = answers(tiny_lm(sharded=True), shares()[rank])
        (Path(tmp) / f"rank_{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_fsdp2_ranks_with_uneven_shares_run_the_same_forwards_and_score_as_one_process(tmp_path):
    torch.multiprocessing.spawn(one_rank, args=(str(tmp_path),), nprocs=2)
    alone = tiny_lm(sharded=False)
    for rank, share in enumerate(shares()):
        got = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        want = answers(alone, share)
        assert got["generate"] == want["generate"]
        assert got["rolling"] == pytest.approx(want["rolling"], rel=1e-5)
        for (score, greedy), (want_score, want_greedy) in zip(
            got["loglikelihood"], want["loglikelihood"], strict=True
        ):
            assert score == pytest.approx(want_score, rel=1e-5) and greedy == want_greedy
