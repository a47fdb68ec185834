"""Export a model to a Hugging Face transformers directory, and check the export.

    python -m scripts.export_hf OUT_DIR --run-dir runs/quickstart-xielu [--step 100] --check
    python -m scripts.export_hf OUT_DIR --model-file model.pt
    python -m scripts.export_hf OUT_DIR --preset tiny --activation xielu --vocab-size 131072

``--run-dir`` exports a training run's checkpoint (the newest unless ``--step``), with the
tokenizer's BOS/EOS ids; ``--model-file`` takes ``torch.save({"config": asdict(ModelConfig),
"model": state_dict})``; with neither, a freshly initialised preset model is exported (to try
the interop).
``--check`` reloads the directory with transformers' own class and reports the largest logits
difference on random tokens. See ``model/hf.py`` for which activation maps to which class.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from model import Llama, ModelConfig
from model.hf import UnsupportedExportError, export_hf
from model.presets import available_presets, load_preset

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(args: argparse.Namespace) -> Llama:
    if args.run_dir:
        from data import load_tokenizer
        from training.checkpoint import load_trained_model

        model, config, _ = load_trained_model(args.run_dir, args.step)
        tokenizer = load_tokenizer(config.data.tokenizer)
        args.bos_token_id = args.bos_token_id if args.bos_token_id is not None else tokenizer.bos_id
        args.eos_token_id = args.eos_token_id if args.eos_token_id is not None else tokenizer.eos_id
        return model
    if args.model_file:
        saved = torch.load(args.model_file, map_location="cpu", weights_only=True)
        model = Llama(ModelConfig(**saved["config"]))
        model.load_state_dict(saved["model"])
        return model
    torch.manual_seed(args.seed)
    return Llama(load_preset(args.preset, activation=args.activation, vocab_size=args.vocab_size))


def check(model: Llama, out_dir: Path) -> float:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).float().eval()
    tokens = torch.randint(0, model.config.vocab_size, (2, min(64, model.config.max_seq_len)))
    with torch.no_grad():
        return float((hf(tokens).logits - model.float().eval()(tokens)).abs().max())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--run-dir", type=Path)
    parser.add_argument("--step", type=int)
    parser.add_argument("--model-file", type=Path)
    parser.add_argument("--preset", default="tiny", choices=available_presets())
    parser.add_argument("--activation", default="xielu")
    parser.add_argument("--vocab-size", type=int, default=131072)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--bos-token-id", type=int)
    parser.add_argument("--eos-token-id", type=int)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)

    model = load_model(args)
    try:
        out = export_hf(
            model, args.out_dir, DTYPES[args.dtype], args.bos_token_id, args.eos_token_id
        )
    except UnsupportedExportError as error:
        sys.exit(f"export_hf: {error}")
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({model.config.activation}, {n_params:,} parameters)")
    if args.check:
        print(f"max |logits difference| against transformers: {check(model, out):.2e}")


if __name__ == "__main__":
    main()
