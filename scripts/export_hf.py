"""Export a model to a Hugging Face transformers directory, and check the export.

    python -m scripts.export_hf OUT_DIR --run-dir runs/quickstart-xielu [--step 100] --check
    python -m scripts.export_hf OUT_DIR --model-file model.pt
    python -m scripts.export_hf OUT_DIR --preset tiny --activation xielu --vocab-size 131072

``--run-dir`` exports a training run's checkpoint (the newest unless ``--step``), with the
tokenizer's BOS/EOS ids; ``--model-file`` takes ``torch.save({"config": asdict(ModelConfig),
"model": state_dict})``; with neither, a freshly initialised preset model is exported (to try
the interop).
``--check`` reloads the directory with transformers' own class and reports the largest logits
difference on the run's own validation text (with ``--run-dir``) and on random tokens, each
against our model as exported and against our model holding the values that class holds: the
second is what the two implementations' arithmetic differs by, the rest is the class's own
rounding of what it stores (transformers' Arcee keeps xIELU's scalars in bf16). See
``model/hf.py`` for which activation maps to which class.
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
    args.text = None
    if args.run_dir:
        from data import load_tokenizer
        from training.checkpoint import load_trained_model

        model, config, _ = load_trained_model(args.run_dir, args.step)
        args.text = validation_tokens(config, model.config.max_seq_len)
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


CHECK_SEQUENCES, CHECK_TOKENS = 2, 64


def validation_tokens(config, max_len: int) -> torch.Tensor | None:
    """The first windows of the run's held-out text (None when it has none to offer)."""
    from data import get_source

    length = min(CHECK_TOKENS, max_len, config.data.seq_len)
    rows = []
    try:
        for window in get_source(config.data.source).validation(config.data):
            rows.append(window["inputs"].reshape(-1)[:length])
            if len(rows) == CHECK_SEQUENCES:
                break
    except Exception as error:  # data not on this machine: random tokens still check
        print(f"no validation text to check on ({error}); random tokens only")
        return None
    return torch.stack(rows) if len(rows) == CHECK_SEQUENCES else None


def check(model: Llama, out_dir: Path, text: torch.Tensor | None = None) -> list[dict]:
    """Per input (validation text, random tokens): the largest |logits difference| between
    transformers' class and our model, and between that class and our model holding the values
    the class holds (``model.hf.holding_what_it_holds``)."""
    from transformers import AutoModelForCausalLM

    from model.hf import holding_what_it_holds

    hf = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).float().eval()
    ours = model.float().eval()
    held = holding_what_it_holds(ours, hf)
    random = torch.randint(
        0,
        model.config.vocab_size,
        text.shape
        if text is not None
        else (CHECK_SEQUENCES, min(CHECK_TOKENS, model.config.max_seq_len)),
    )
    inputs = [("validation text", text)] if text is not None else []
    rows = []
    with torch.no_grad():
        for name, tokens in [*inputs, ("random tokens", random)]:
            theirs = hf(tokens).logits
            rows.append(
                {
                    "class": type(hf).__name__,
                    "input": f"{name} ({tokens.shape[0]} x {tokens.shape[1]})",
                    "difference": float((theirs - ours(tokens)).abs().max()),
                    "arithmetic": float((theirs - held(tokens)).abs().max()),
                }
            )
    return rows


def report(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        rounding = r["difference"] - r["arithmetic"]
        share = rounding / r["difference"] if r["difference"] else 0.0
        lines.append(
            f"{r['class']}, {r['input']}: max |logits difference| {r['difference']:.2e}; "
            f"{r['arithmetic']:.2e} against our model holding the values {r['class']} holds, "
            f"so its own rounding of them explains {max(share, 0.0):.0%}"
        )
    return lines


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
        print("\n".join(report(check(model, out, args.text))))


if __name__ == "__main__":
    main()
