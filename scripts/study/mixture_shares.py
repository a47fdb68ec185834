"""Measure a mixture's realised token shares, beside what mixing documents would have given.

    python -m scripts.study.mixture_shares                          # configs/data/mixture.yaml
    python -m scripts.study.mixture_shares --windows 4000 data.tokenizer.name=mistral_nemo \\
        'data.sources=[{name: c4, source: local, weight: 0.5, paths: [c4/*.json.gz]}, ...]'

Reads ``--windows`` training windows of one stream through the real loader (the arguments
after the options are ``train.py`` overrides; ``data=mixture`` is implied) and prints, for each
source: its weight, its share of the training tokens as drawn (``data/share/<name>`` in a
run), the documents read and their mean length in tokens, and the share the same weights would
give if whole documents were drawn by weight and packed together, ``w_i L_i / sum_j w_j L_j``
(what packing interleaved sources does to the ratios: sources of longer documents take more).
"""

from __future__ import annotations

import argparse
import itertools

from data import build_loader, counters, source_tokens
from data.mixture import normalised_weights
from scripts.common import markdown
from training.sweeps import resolve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--windows", type=int, default=2000)
    parser.add_argument("overrides", nargs="*", help="train.py overrides (data.sources=...)")
    args = parser.parse_args(argv)
    config = resolve(["data=mixture", "data.num_workers=0", *args.overrides]).data
    loader = build_loader(config, batch_size=1)
    for _ in itertools.islice(loader, args.windows):
        pass
    state = loader.state_dict()
    drawn = source_tokens(counters(state))
    children = state["dataset_state"]["pending"]["children"]
    stats = [(child or {}).get("stats", {}) for child in children]
    weights = normalised_weights(config)
    lengths = [own.get("tokens", 0) / max(own.get("documents", 0), 1) for own in stats]
    by_document = sum(w * n for w, n in zip(weights, lengths, strict=True))
    total = sum(drawn[e.name] for e in config.sources)
    rows = [
        [
            entry.name,
            f"{weight:.3f}",
            f"{drawn[entry.name] / total:.4f}",
            f"{own.get('documents', 0):,}",
            f"{length:,.0f}",
            f"{weight * length / by_document:.3f}" if by_document else "-",
        ]
        for entry, weight, own, length in zip(config.sources, weights, stats, lengths, strict=True)
    ]
    header = ["source", "weight", "share drawn", "documents", "tokens/doc", "documents mixed"]
    print(f"{args.windows:,} windows of {config.seq_len} tokens, {config.tokenizer.name}")
    print("\n".join(markdown(header, rows)))


if __name__ == "__main__":
    main()
