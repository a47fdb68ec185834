"""Train a SentencePiece tokenizer on local text, for ``data.tokenizer.name=sentencepiece``.

    python -m scripts.train_sentencepiece corpus/*.txt --prefix tok/sp --vocab-size 32000

Inputs are plain-text files, one sentence or paragraph per line. EOS (id 2) separates
documents in the pipeline; BOS is 1, unknown 0. Byte fallback keeps every input encodable.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def train(inputs: list[str], prefix: str | Path, vocab_size: int, model_type: str = "bpe") -> Path:
    import sentencepiece

    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        input=",".join(inputs),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=True,
        character_coverage=0.9995,
        pad_id=-1,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        minloglevel=2,
    )
    return Path(f"{prefix}.model")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    args = parser.parse_args(argv)
    print(f"wrote {train(args.inputs, args.prefix, args.vocab_size, args.model_type)}")


if __name__ == "__main__":
    main()
