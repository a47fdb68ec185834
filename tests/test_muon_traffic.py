"""What one Muon step moves between ranks under FSDP2: each matrix gathered to its one owner and
its rows scattered back, counted on 2 and 4 gloo ranks against the formula written out here,
and the update equal to the one computed on the whole matrices in one process.

The matrices have rows that do not divide by the world size (FSDP2's uneven shards; one has
fewer rows than ranks, so a rank holds none of it), and more matrices than ranks.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch

SHAPES = [(10, 6), (7, 12), (3, 5), (16, 16), (9, 4)]  # rows x columns of each Muon matrix
LR, MOMENTUM = 0.02, 0.95


def matrices() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=g) for shape in SHAPES]


def gradients() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(shape, generator=g) for shape in SHAPES]


def expected_elements(world: int, rank: int) -> int:
    """The formula, written out: matrix i belongs to rank i % world; every shard is padded to
    ceil(rows / world) rows. A rank sends its padded rows of each matrix it does not own (the
    gather) and, for each it owns, the other ranks' padded rows (the scatter); it receives as
    much, the other way round."""
    total = 0
    for i, (rows, cols) in enumerate(SHAPES):
        padded = -(-rows // world) * cols
        total += (world - 1) * padded if i % world == rank else padded
    return total


def one_rank(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from training.muon import MuonAdamW

    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/rendezvous",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    counted = {"sent": 0, "received": 0}
    gather, scatter = dist.gather, dist.scatter

    def counting_gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
        if dist.get_rank() == dst:
            counted["received"] += (len(gather_list) - 1) * tensor.numel()
        else:
            counted["sent"] += tensor.numel()
        return gather(tensor, gather_list, dst=dst, group=group, async_op=async_op)

    def counting_scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
        if dist.get_rank() == src:
            counted["sent"] += (len(scatter_list) - 1) * tensor.numel()
        else:
            counted["received"] += tensor.numel()
        return scatter(tensor, scatter_list, src=src, group=group, async_op=async_op)

    def refused(*args, **kwargs):
        raise AssertionError("a whole matrix was sent to every rank")

    dist.gather, dist.scatter, dist.broadcast = counting_gather, counting_scatter, refused
    DTensor.full_tensor = refused
    try:
        mesh = init_device_mesh("cpu", (world,))
        params = [torch.nn.Parameter(distribute_tensor(m, mesh, [Shard(0)])) for m in matrices()]
        for p, g in zip(params, gradients(), strict=True):
            p.grad = distribute_tensor(g, mesh, [Shard(0)])
        optimizer = MuonAdamW(
            [{"params": params, "muon": True}], lr=LR, momentum=MOMENTUM, weight_decay=0.0
        )
        optimizer.step()
        shards = [p.to_local().tolist() for p in params]
        (Path(tmp) / f"rank_{rank}.json").write_text(json.dumps({**counted, "shards": shards}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_a_rank_moves_its_share_of_the_matrices_and_the_update_is_one_processes(tmp_path, world):
    from training.muon import MuonAdamW, row_shards

    torch.multiprocessing.spawn(one_rank, args=(world, str(tmp_path)), nprocs=world)
    alone = [torch.nn.Parameter(m) for m in matrices()]
    for p, g in zip(alone, gradients(), strict=True):
        p.grad = g
    MuonAdamW([{"params": alone, "muon": True}], lr=LR, momentum=MOMENTUM).step()
    whole_elements = sum(rows * cols for rows, cols in SHAPES)
    for rank in range(world):
        got = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert got["sent"] == got["received"] == expected_elements(world, rank)
        assert got["received"] < whole_elements  # before: every matrix, whole, on every rank
        for p, shard in zip(alone, got["shards"], strict=True):
            rows = row_shards(p.size(0), world)
            start = sum(rows[:rank])
            mine = p.detach()[start : start + rows[rank]]
            got_rows = torch.tensor(shard, dtype=mine.dtype).reshape(mine.shape)
            torch.testing.assert_close(got_rows, mine, rtol=0, atol=1e-6)


@pytest.mark.parametrize("world", [1, 2, 4, 16])
def test_the_price_counts_the_traffic_this_test_counts(world):
    from training.muon import exchange_elements

    if world == 1:
        assert exchange_elements(SHAPES, 1) == [0]  # one process exchanges nothing
        return
    assert exchange_elements(SHAPES, world) == [expected_elements(world, r) for r in range(world)]


@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (96, 96)])
def test_the_newton_schulz_flops_are_the_ones_torch_counts(shape):
    from torch.utils.flop_counter import FlopCounterMode

    from training.muon import newton_schulz_flops, orthogonalize

    with FlopCounterMode(display=False) as counter:
        orthogonalize(torch.randn(shape))
    assert newton_schulz_flops(*shape) == counter.get_total_flops()


def test_a_muon_job_is_priced_with_its_matrices_and_an_adamw_job_without():
    """``scripts.estimate_sweep`` on the cluster sweep: the Muon runs pay Newton-Schulz on every
    attention and MLP matrix (7 per block of a gated MLP) and their exchange on 4 ranks."""
    from scripts.estimate_sweep import job_cost
    from training.muon import exchange_elements, newton_schulz_flops
    from training.sweeps import expand, load_sweep, with_unread_paths

    jobs = expand(load_sweep("optimizers_gh200"), with_unread_paths([]))
    muon = next(j for j in jobs if "optim.name=muon" in j and "activation=swiglu" in j)
    adamw = next(j for j in jobs if "optim.name=muon" not in j and "activation=swiglu" in j)
    cost = job_cost(muon, ranks=4)
    dim, layers, kv, hidden = 1536, 12, 1536, 4 * 1536  # paper_1b: MHA, gated width 4 x dim
    blocks = [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (hidden, dim), (hidden, dim)]
    shapes = [*blocks, (dim, hidden)] * layers
    assert cost["muon_flops_per_step"] == sum(newton_schulz_flops(*s) for s in shapes)
    assert cost["muon_elements_per_step"] == max(exchange_elements(shapes, 4))
    assert job_cost(adamw, ranks=4)["muon_flops_per_step"] == 0
