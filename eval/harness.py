"""lm-evaluation-harness adapter for the project's own model (any activation, no export needed).

Implements lm-eval's three request types on ``model.Llama`` with the run's tokenizer:
``loglikelihood`` (multiple choice), ``loglikelihood_rolling`` (perplexity tasks) and greedy
``generate_until`` (GSM8K, TriviaQA). A context is preceded by what precedes every training
document: EOS (the end of the one before), then BOS when the run packed with
``data.tokenizer.add_bos`` (``data.tokenizers.encode_document``). It is truncated from the
left to the model's length (for generation: to the length that leaves room for
``max_gen_toks``, as lm-eval's own Hugging Face model does).
Generation decodes ``batch_size`` requests together with a KV cache (``model/sampling.py``).
Under torch.distributed each rank scores lm-eval's share for it, and every rank runs as many
forwards as the busiest one (FSDP2: each forward is a collective).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from lm_eval.api.model import LM
from tqdm import tqdm

from model import Llama
from model.sampling import GREEDY, generate
from training.runtime import distributed

IGNORE = -100  # a target the model does not score (model.loss)


class ProjectLM(LM):
    def __init__(
        self,
        model: Llama,
        tokenizer,
        batch_size: int = 8,
        device: str = "cpu",
        add_bos: bool = False,
    ):
        super().__init__()
        # lm-eval shares the documents out by rank and gathers the metrics (evaluator.evaluate);
        # under torch.distributed every rank takes its share (the trainer's in-loop evaluation)
        if dist.is_initialized():
            self._rank, self._world_size = dist.get_rank(), dist.get_world_size()
        self._device = torch.device(device)
        bos = [tokenizer.bos_id] if add_bos and tokenizer.bos_id is not None else []
        self.prefix = [tokenizer.eos_id, *bos]
        # a model already there is left as it is: FSDP2's .to() reshards and swaps every
        # parameter, which a parameter still referenced elsewhere refuses
        if any(p.device != self._device for p in model.parameters()):
            model = model.to(device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size_per_call = batch_size
        self.max_length = model.config.max_seq_len

    # ---- lm-eval's collectives, for several ranks -----------------------------------------
    def all_gather(self, tensor):
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj, dst=0):
        out = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        dist.barrier()

    # ---- the same forwards on every rank ----------------------------------------------------
    # lm-eval gives the ranks equal numbers of requests, but how many forwards a rank's share
    # takes depends on it (generation stops when it stops; rolling windows follow the text's
    # length). Under FSDP2 every forward gathers each block's shards from all ranks, so a rank
    # that is done runs forwards whose output nobody reads until the busiest one is done too.
    def _most_over_ranks(self, n: int) -> int:
        return int(distributed.all_reduce_max([n], self.device)[0])

    def _all_done(self, done: bool) -> bool:
        return not distributed.any_rank(not done, self.device)

    @torch.no_grad()
    def _idle_forward(self) -> None:
        self.model(torch.full((1, 1), self.tokenizer.eos_id, device=self.device))

    # ---- helpers -------------------------------------------------------------------------
    def _context_ids(self, text: str) -> list[int]:
        return [*self.prefix, *self.tokenizer.encode(text)] if text else list(self.prefix)

    @torch.no_grad()
    def _continuation_logprobs(
        self, pairs: list[tuple[list[int], list[int]]], progress: bool = False
    ) -> list[tuple[float, bool]]:
        """For each (context ids, continuation ids): (sum log p(continuation), all greedy).
        Only the continuation's tokens are scored, in the model's chunks: no [batch, length,
        vocab] logits (``Llama.forward(per_token=True)``)."""
        out = []
        starts = range(0, len(pairs), self.batch_size_per_call)
        idle = self._most_over_ranks(len(starts)) - len(starts)
        for start in tqdm(starts, desc="loglikelihood", unit="batch", disable=not progress):
            chunk = pairs[start : start + self.batch_size_per_call]
            rows = [(ctx + cont)[-(self.max_length + 1) :] for ctx, cont in chunk]
            width = max(len(ids) - 1 for ids in rows)
            inputs = torch.full((len(rows), width), self.tokenizer.eos_id, dtype=torch.long)
            targets = torch.full((len(rows), width), IGNORE, dtype=torch.long)
            for i, (ids, (_, cont)) in enumerate(zip(rows, chunk, strict=True)):
                end = len(ids) - 1
                n = min(len(cont), end)
                inputs[i, :end] = torch.tensor(ids[:-1])
                targets[i, end - n : end] = torch.tensor(ids[end - n + 1 : end + 1])
            logprobs, greedy = self.model(
                inputs.to(self.device), targets.to(self.device), per_token=True
            )
            totals = logprobs.double().sum(dim=1).tolist()
            out += zip(totals, greedy.all(dim=1).tolist(), strict=True)
        for _ in range(idle):
            self._idle_forward()
        return out

    # ---- lm-eval's interface ---------------------------------------------------------------
    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        pairs = []
        for request in requests:
            context, continuation = request.args
            # a leading space belongs to the continuation's first token, as BPE encodes it
            pairs.append((self._context_ids(context), self.tokenizer.encode(continuation)))
        return self._continuation_logprobs(pairs, progress=len(pairs) >= 10)

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Every token a target once: windows of ``max_length`` tokens, each after the text
        before it (truncated on the left), the windows of all requests batched together."""
        windows, owner = [], []
        for i, request in enumerate(requests):
            ids = self.tokenizer.encode(request.args[0])
            for start in range(0, len(ids), self.max_length):
                windows.append(([*self.prefix, *ids[:start]], ids[start : start + self.max_length]))
                owner.append(i)
        totals = [0.0] * len(requests)
        scored = self._continuation_logprobs(windows, progress=len(windows) >= 10)
        for i, (logprob, _) in zip(owner, scored, strict=True):
            totals[i] += logprob
        return totals

    def generate_until(self, requests) -> list[str]:
        outputs = []
        size = self.batch_size_per_call
        starts = range(0, len(requests), size)
        idle = self._most_over_ranks(len(starts)) - len(starts)
        bar = tqdm(total=len(requests), desc="generate", unit="request", disable=len(requests) < 10)
        for start in starts:
            outputs += self._generate_batch(requests[start : start + size])
            bar.update(len(requests[start : start + size]))
        bar.close()
        for _ in range(idle):  # one forward to start, then as long as the others decode
            self._idle_forward()
            while not self._all_done(True):
                self._idle_forward()
        return outputs

    @torch.no_grad()
    def _generate_batch(self, requests) -> list[str]:
        """Greedy continuations of several requests, decoded together, each cut at the first of
        its ``until`` strings and stopped after its ``max_gen_toks``."""
        prompts, stops, limits = [], [], []
        for request in requests:
            context, kwargs = request.args
            until = kwargs.get("until") or []
            stops.append([until] if isinstance(until, str) else list(until))
            limits.append(int(kwargs.get("max_gen_toks", 256)))
            room = max(1, min(self.max_length - 1, self.max_length - limits[-1]))
            prompts.append(self._context_ids(context)[-room:])

        def stop(row: int, new: list[int]) -> bool:
            if len(new) >= limits[row]:
                return True
            text = self.tokenizer.decode(new, skip_special=True)
            return any(s in text for s in stops[row])

        generations = generate(
            self.model,
            prompts,
            max(limits),
            GREEDY,
            eos_id=self.tokenizer.eos_id,
            vocab_limit=self.tokenizer.vocab_size,
            stop=stop,
            lockstep=self._all_done if self.world_size > 1 else None,
        )
        outputs = []
        for generation, until in zip(generations, stops, strict=True):
            # specials and padding ids dropped, as lm-eval's own HF model does: a name or
            # placeholder must not become part of the answer lm-eval extracts
            text = self.tokenizer.decode(generation.tokens, skip_special=True)
            for s in until:
                text = text.split(s)[0]
            outputs.append(text)
        return outputs
