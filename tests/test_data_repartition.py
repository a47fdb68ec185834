"""Resume on another world size x workers: over the whole run no token is lost or seen twice.

Each test runs 2 ranks x 2 workers, resumes on 1 rank x 1 worker, resumes again on 2 ranks x 1
worker before the first carry-over is read, and reads on to the end of an epoch; the tokens of
every window of the run are then exactly those of that many epochs (``data.repartition``).
"""

from collections import Counter

import pytest
import torch

from data import DataConfig, TokenizerConfig, build_loader, get_source, restore_loader
from data.packing import IGNORE_INDEX
from data.partition import share
from data.repartition import (
    CannotRepartitionError,
    merge_buffers,
    merge_stats,
    new_identity,
    switch_epoch,
)
from data.shards import TokenCorpus
from data.sources.tokenized import TokenStream, epoch_order, training_windows
from data.text import TextStream
from data_fixtures import DOCUMENTS, write_parquet_corpus
from scripts.pretokenize import pretokenize

BATCH = 4


def text_config(directory, **overrides) -> DataConfig:
    base = dict(
        source="local",
        paths=[str(directory / "*.parquet")],
        seq_len=16,
        validation_documents=10,
        shuffle=True,
        num_workers=2,
        tokenizer=TokenizerConfig("mistral_nemo"),
    )
    return DataConfig(**{**base, **overrides})


def take(loader, n: int) -> list[dict]:
    it = iter(loader)
    return [next(it) for _ in range(n)]


def stream_states(loader_state: dict) -> list:
    """Each worker's stream state of a loader's state (one without workers: its one stream)."""
    if "_snapshot" not in loader_state:
        return [loader_state["dataset_state"]["pending"]]
    workers = loader_state["_snapshot"]["_worker_snapshots"]
    return [workers[f"worker_{w}"]["dataset_state"]["pending"] for w in range(len(workers))]


def targets(windows) -> Counter:
    counts: Counter = Counter()
    for window in windows:
        t = window["targets"]
        counts.update(t[t != IGNORE_INDEX].tolist())
    return counts


def assert_same_states(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_states(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_buffers_join_without_the_overlap_token_and_an_empty_one_starts_with_eos():
    old = [torch.tensor([9, 1, 2]), None, torch.tensor([8, 3]), torch.tensor([7, 4, 5])]
    joined = merge_buffers(old, n_new=3, eos_id=0)
    # old 0 and 3 go to new 0: 3's first token (7) was already its last window's last target
    assert [b.tolist() for b in joined] == [[9, 1, 2, 4, 5], [0], [8, 3]]


@pytest.mark.slow
@pytest.mark.parametrize(
    "files, row_group_size",
    [(3, 20), (1, 1000)],  # 18 fragments: shared by fragment; 1 fragment: by row (n > 1)
    ids=["by_fragment", "by_row"],
)
def test_text_2x2_then_1x1_then_2x1_reads_every_token_once_per_epoch(
    tmp_path, files, row_group_size
):
    write_parquet_corpus(tmp_path, files=files, row_group_size=row_group_size)
    cfg = text_config(tmp_path)
    whole = list(TextStream(cfg, epochs=1))  # one uninterrupted epoch on one stream
    epoch_tokens = targets(whole) + Counter([int(whole[0]["inputs"][0])])
    per_stream = [len(list(TextStream(cfg, s, 4, epochs=1))) for s in range(4)]
    # phase 1, 2 ranks x 2 workers, until some streams are in their second epoch
    steps = (min(per_stream) + max(per_stream)) // 2 // BATCH + 2  # batches per worker
    first = [build_loader(cfg, BATCH, rank, 2) for rank in (0, 1)]
    phase1 = [take(loader, 2 * steps) for loader in first]
    seen = sum((targets(batches) for batches in phase1), Counter())
    # the four streams' first tokens, never a target (workers deliver batches in turn)
    seen.update(int(batches[w]["inputs"][0, 0]) for batches in phase1 for w in (0, 1))
    saved = [loader.state_dict() for loader in first]
    epochs = [state["epoch"] for saved_rank in saved for state in stream_states(saved_rank)]
    if files > 1:
        assert min(epochs) == 0 and max(epochs) == 1  # the streams are in different epochs

    # phase 2, 1 rank x 1 worker: saved before reading anything, then resumed as usual
    second = build_loader(text_config(tmp_path, num_workers=1), BATCH)
    restore_loader(second, saved)
    unread = second.state_dict()
    (state,) = stream_states(unread)
    assert state["epoch"] == 2 and len(state["carry"]) > 0  # the switch epoch, the carry-over
    resumed = build_loader(text_config(tmp_path, num_workers=1), BATCH)
    restore_loader(resumed, [unread])
    seen += targets(take(resumed, 60))
    (state,) = stream_states(resumed.state_dict())
    assert "carry" in state  # still reading the carry-over

    # phase 3, 2 ranks x 1 worker, each stream until its third epoch ends
    new = get_source("local").repartition(text_config(tmp_path, num_workers=1), [state], 2)
    documents = 0
    for rank in (0, 1):
        stream = TextStream(text_config(tmp_path, num_workers=1), rank, 2, epochs=3)
        stream.load_streams({rank: new[rank]})
        seen += targets(stream)
        documents += stream.state_dict()["pending"]["stats"]["documents"]
    assert seen == Counter({token: 3 * n for token, n in epoch_tokens.items()})
    assert documents == 3 * (DOCUMENTS - 10)  # the counters too: every document once per epoch


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    text = tmp_path_factory.mktemp("text")
    write_parquet_corpus(text, files=3, row_group_size=20)
    out = tmp_path_factory.mktemp("shards")
    pretokenize(text_config(text), out, shard_tokens=4000, workers=1)
    return out


def token_config(directory, **overrides) -> DataConfig:
    base = dict(
        source="tokenized",
        paths=[str(directory / "*.bin")],
        seq_len=16,
        validation_documents=10,
        num_workers=2,
    )
    return DataConfig(**{**base, **overrides})


def batch_of_one(window: dict) -> dict:
    return {key: value[None] for key, value in window.items()}


def as_windows(batches) -> list[tuple]:
    """Each window as its tokens (inputs, then the last target)."""
    out = []
    for batch in batches:
        for inputs, target in zip(batch["inputs"], batch["targets"], strict=True):
            out.append((*inputs.tolist(), int(target[-1])))
    return out


@pytest.mark.slow
def test_tokenized_2x2_then_1x1_then_2x1_yields_every_window_once_per_epoch(shards):
    cfg = token_config(shards)
    windows = training_windows(cfg, TokenCorpus(cfg))
    stream = iter(TokenStream(cfg))  # one uninterrupted epoch on one stream
    one_epoch = Counter(as_windows(batch_of_one(next(stream)) for _ in range(windows)))
    assert len(one_epoch) == windows  # all distinct: a window is known by its tokens
    # phase 1: 2 ranks x 2 workers, into the second epoch (windows / 4 per stream and epoch)
    steps = windows * 3 // 2 // 4 // BATCH
    first = [build_loader(cfg, BATCH, rank, 2) for rank in (0, 1)]
    seen = Counter(w for loader in first for w in as_windows(take(loader, 2 * steps)))
    saved = [loader.state_dict() for loader in first]
    # phase 2: 1 rank x 1 worker
    second = build_loader(token_config(shards, num_workers=1), BATCH)
    restore_loader(second, saved)
    seen.update(as_windows(take(second, 40)))
    (state,) = stream_states(second.state_dict())
    assert state["epoch"] == 2 and state["carry_done"] < len(state["carry"])
    # phase 3: 2 ranks x 1 worker, each to the end of the third epoch
    new = get_source("tokenized").repartition(token_config(shards, num_workers=1), [state], 2)
    for rank in (0, 1):
        stream = TokenStream(token_config(shards, num_workers=1), rank, 2)
        stream.load_streams({rank: new[rank]})
        count = len(new[rank]["carry"]) + len(share(epoch_order(cfg, windows, 2), rank, 2))
        it = iter(stream)
        seen.update(as_windows(batch_of_one(next(it)) for _ in range(count)))
    assert seen == Counter({window: 3 for window in one_epoch})


def test_a_worker_count_change_alone_re_partitions_the_streams(shards):
    loader = build_loader(token_config(shards), BATCH)
    take(loader, 5)
    saved = loader.state_dict()
    fewer = build_loader(token_config(shards, num_workers=0), BATCH)
    restore_loader(fewer, [saved])
    (state,) = stream_states(fewer.state_dict())
    assert len(state["carry"]) > 0 and state["stats"]["windows"] == 5 * BATCH


def test_a_streamed_hub_source_refuses_another_layout_and_says_what_to_do(tmp_path):
    write_parquet_corpus(tmp_path, files=2, row_group_size=20)
    cfg = DataConfig(
        source="fineweb_edu",
        paths=[str(p) for p in sorted(tmp_path.glob("*.parquet"))],
        seq_len=16,
        validation_documents=10,
        num_workers=0,
    )
    loader = build_loader(cfg, BATCH)
    take(loader, 2)
    other = build_loader(cfg, BATCH, rank=0, world_size=2)
    with pytest.raises(CannotRepartitionError, match=r"1 ranks x 0 workers .* 2 x 0") as error:
        restore_loader(other, [loader.state_dict()])
    assert "original world size" in str(error.value)
    assert "scripts.pretokenize" in str(error.value) and "data=tokenized" in str(error.value)


@pytest.mark.slow
def test_a_two_process_run_resumes_in_one_process_where_its_data_left_off(tmp_path):
    """torchrun 2 processes for 4 steps, then 1 process for 4 more: the trainer's data position
    is, step for step, the one the data layer computes (whose exactness the tests above show)."""
    from train_helpers import compose, losses, run, tiny_overrides

    corpus, run_dir = tmp_path / "corpus", tmp_path / "run"
    write_parquet_corpus(corpus, files=3, row_group_size=20)
    overrides = tiny_overrides(
        corpus,
        run_dir,
        **{"trainer.steps": 4, "schedule.decay_steps": 2, "validation.every": 0},
    )
    code, output = run(overrides, ranks=2, timeout=240)
    assert code == 0, output[-3000:]
    code, output = run([*overrides, "trainer.steps=8"], timeout=240)
    assert code == 0 and "resumed from" in output and "at step 4" in output, output[-3000:]
    assert sorted(losses(run_dir)) == list(range(1, 9))

    def saved(step: int, rank: int) -> dict:
        path = run_dir / "checkpoints" / f"step_{step:06d}" / f"rank_{rank:05d}.pt"
        (state,) = stream_states(torch.load(path, weights_only=True)["data"])
        return state

    cfg = compose(overrides)[0].data
    first = [build_loader(cfg, 2, rank, 2) for rank in (0, 1)]  # 1 micro-batch of 2 a step
    for rank, loader in enumerate(first):
        take(loader, 4)
        assert_same_states(saved(4, rank), stream_states(loader.state_dict())[0])
    resumed = build_loader(cfg, 2)
    restore_loader(resumed, [loader.state_dict() for loader in first])
    take(resumed, 8)  # 2 micro-batches a step in 1 process
    assert_same_states(saved(8, 0), stream_states(resumed.state_dict())[0])


def test_the_switch_epoch_is_the_latest_epoch_any_old_stream_has_started_reading():
    """Rule 1: E = max over old streams of epoch + 1 if it has read anything of it."""
    assert switch_epoch([(2, True), (2, False)]) == 3  # one stream is into epoch 2
    assert switch_epoch([(2, False), (1, True)]) == 2  # nobody has read anything of epoch 2
    assert switch_epoch([(0, False)]) == 0 and switch_epoch([]) == 0


def test_counters_go_whole_to_new_stream_0_and_every_new_stream_gets_a_state():
    """Rule 4, for a change to 3 streams: the sum in stream 0, nothing in streams 1 and 2."""
    merged = merge_stats([{"documents": 3, "tokens": 40}, {"documents": 2, "bad_records": 1}], 3)
    assert merged == [{"documents": 5, "tokens": 40, "bad_records": 1}, {}, {}]


def test_a_one_token_buffer_is_carried_over_and_an_empty_stream_starts_at_eos():
    """Rule 3: a buffer of one token (the last window's last target, the next one's first
    input) is kept; a new stream given no buffer starts with EOS."""
    merged = merge_buffers([torch.tensor([7]), None, torch.tensor([])], 2, eos_id=0)
    assert [m.tolist() for m in merged] == [[7], [0]]
    assert all(m.dtype == torch.long for m in merged)


def test_data_states_out_of_stream_order_are_refused():
    """Every old stream's state must be stream s of n at position s: a checkpoint whose rank
    files were mixed up would otherwise be dealt to the wrong new streams, silently."""
    current = {"data": "corpus", "n_streams": 1}

    def state(stream, n_streams=2):
        return {"stream": stream, "identity": {"data": "corpus", "n_streams": n_streams}}

    assert new_identity([state(0), state(1)], current) == current
    assert new_identity([None, state(1)], current) == current  # a stream that read nothing
    with pytest.raises(ValueError, match=r"data state 1 of 2 is stream 0 of 2: .* out of order"):
        new_identity([None, state(0)], current)
    with pytest.raises(ValueError, match="data state 1 of 2 is stream 1 of 3"):
        new_identity([state(0), state(1, n_streams=3)], current)
