"""lm-evaluation-harness adapter for the project's own model (any activation, no export needed).

Implements lm-eval's three request types on ``model.Llama`` with the run's tokenizer:
``loglikelihood`` (multiple choice), ``loglikelihood_rolling`` (perplexity tasks) and greedy
``generate_until`` (GSM8K, TriviaQA). A context is preceded by EOS, the token every training
document follows, and is truncated from the left to the model's length. Generation recomputes
the prefix each token (no KV cache): fine for evaluation-sized outputs of these models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.api.model import LM
from tqdm import tqdm

from model import Llama


class ProjectLM(LM):
    def __init__(self, model: Llama, tokenizer, batch_size: int = 8, device: str = "cpu"):
        super().__init__()
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.batch_size_per_call = batch_size
        self.device_ = torch.device(device)
        self.max_length = model.config.max_seq_len

    # ---- helpers -------------------------------------------------------------------------
    def _context_ids(self, text: str) -> list[int]:
        return (
            [self.tokenizer.eos_id, *self.tokenizer.encode(text)]
            if text
            else [self.tokenizer.eos_id]
        )

    @torch.no_grad()
    def _continuation_logprobs(self, pairs: list[tuple[list[int], list[int]]]):
        """For each (context ids, continuation ids): (sum log p(continuation), all greedy)."""
        out = []
        for start in range(0, len(pairs), self.batch_size_per_call):
            chunk = pairs[start : start + self.batch_size_per_call]
            rows = []
            for ctx, cont in chunk:
                ids = (ctx + cont)[-(self.max_length + 1) :]
                rows.append((ids, min(len(cont), len(ids) - 1)))
            width = max(len(ids) - 1 for ids, _ in rows)
            inputs = torch.full((len(rows), width), self.tokenizer.eos_id, dtype=torch.long)
            for i, (ids, _) in enumerate(rows):
                inputs[i, : len(ids) - 1] = torch.tensor(ids[:-1])
            logprobs = F.log_softmax(self.model(inputs.to(self.device_)).float(), dim=-1).cpu()
            for i, (ids, n) in enumerate(rows):
                end = len(ids) - 1
                targets = torch.tensor(ids[end - n + 1 : end + 1])
                scores = logprobs[i, end - n : end]
                total = float(scores.gather(1, targets[:, None]).sum())
                greedy = bool((scores.argmax(-1) == targets).all())
                out.append((total, greedy))
        return out

    # ---- lm-eval's interface ---------------------------------------------------------------
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = []
        for request in requests:
            context, continuation = request.args
            # a leading space belongs to the continuation's first token, as BPE encodes it
            pairs.append((self._context_ids(context), self.tokenizer.encode(continuation)))
        return self._continuation_logprobs(pairs)

    def loglikelihood_rolling(self, requests) -> list[float]:
        results = []
        for request in tqdm(requests, desc="rolling loglikelihood", disable=len(requests) < 10):
            ids = self.tokenizer.encode(request.args[0])
            total = 0.0
            for start in range(0, len(ids), self.max_length):
                window = ids[start : start + self.max_length]
                context = [self.tokenizer.eos_id, *ids[:start]]  # truncated on the left
                total += self._continuation_logprobs([(context, window)])[0][0]
            results.append(total)
        return results

    @torch.no_grad()
    def generate_until(self, requests) -> list[str]:
        outputs = []
        for request in tqdm(requests, desc="generate", disable=len(requests) < 10):
            context, kwargs = request.args
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", 256))
            ids = self._context_ids(context)
            new: list[int] = []
            text = ""
            for _ in range(max_new):
                window = torch.tensor([(ids + new)[-self.max_length :]], device=self.device_)
                token = int(self.model(window)[0, -1].argmax())
                if token == self.tokenizer.eos_id:
                    break
                new.append(token)
                text = self.tokenizer.decode(new)
                if any(stop in text for stop in until):
                    break
            for stop in until:
                text = text.split(stop)[0]
            outputs.append(text)
        return outputs
