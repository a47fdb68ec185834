"""The model's section: every architectural knob, its type, default and meaning, and every check
of them (:meth:`ModelConfig.check`: each knob's range, then the fields against each other), so a
config that cannot build a model is refused when it is composed, naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from model.document_attention import KERNELS
from settings import ConfigError, Run, Section, at_least, one_of, positive
from xielu import is_gated
from xielu.registry import check_options

# A plain MLP (up/down) has 2 matrices, a gated one (gate/up/down) 3: widening the plain hidden
# size by 3/2 gives both the same parameters and FLOPs (paper, section 4: 6144 vs 9216).
PLAIN_TO_GATED_WIDTH = 1.5


def pad_vocab(size: int, multiple: int) -> int:
    """Round a tokenizer's vocabulary up so the embedding and LM-head matmuls tile evenly."""
    if size <= 0 or multiple <= 0:
        raise ValueError(f"vocab size and multiple must be positive, got {size} and {multiple}")
    return -(-size // multiple) * multiple


@dataclass
class ModelConfig(Section):
    """A Llama decoder whose MLP activation is pluggable.

    Attributes:
        vocab_size: embedding rows; the trainer fills it from the tokenizer (padded to
            ``vocab_multiple``) unless set explicitly, e.g. to the paper's 147456.
        dim: hidden size.
        n_layers: transformer blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention: each serves n_heads / n_kv_heads
            query heads); ``None`` is ``n_heads``, the paper's multi-head attention. Apertus:
            32 query heads, 8 groups.
        gated_hidden: the gated MLP width the comparison is matched to (paper: 4 * dim).
        mlp_hidden: explicit MLP width; ``None`` derives it (gated: ``gated_hidden``, plain:
            1.5 * ``gated_hidden``).
        activation: a name from the ``xielu`` registry.
        activation_kwargs: options for that activation (e.g. ``alpha_p_init``).
        rope_theta: RoPE base (paper: 500000).
        rope_scaling_factor: RoPE scaling's factor; 1 (the paper) is plain RoPE. How it
            scales is ``rope_scaling``.
        rope_scaling: ``linear``: position interpolation, every position divided by the factor
            (transformers' ``linear`` type); ``llama3``: Llama 3.1's frequency-dependent
            scaling (transformers' ``llama3`` type; Apertus: factor 8): wavelengths longer than
            ``rope_original_max_seq_len / rope_low_freq_factor`` are stretched by the factor,
            shorter than ``... / rope_high_freq_factor`` kept, those between blended.
        rope_low_freq_factor, rope_high_freq_factor, rope_original_max_seq_len: ``llama3``'s
            other three numbers (Llama 3.1 and Apertus: 1, 4, 8192).
        attention: the kernel that keeps attention inside each packed document when the data
            carries document ids (``data.document_mask``): ``flex`` (FlexAttention), ``sdpa`` (a
            dense mask, the reference) or ``auto`` (the faster on the device: flex on a GPU,
            the dense mask on a CPU, as measured; ``model/document_attention.py``). Without
            document ids attention is causal SDPA whatever this says.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: share the embedding and LM-head matrix (paper: 1.1B yes, 3B no).
        qk_norm: RMSNorm on each head's queries and keys (as in the Apertus models).
        max_seq_len: longest sequence the RoPE tables are built for.
        init_std: standard deviation of the normal initialisation (at the reference width).
        init_scaling: ``fixed`` (the paper: ``init_std`` at every width) or ``width``
            (``init_std * sqrt(init_reference_dim / dim)``). A matrix reading the RMS-normalised
            residual stream gives outputs of RMS about ``std * sqrt(dim)``, so ``width`` keeps
            the MLP pre-activation at the scale it has at the reference width, where the
            activation works in the paper's regime: 0.78 at the 1.1B's 1536 with 0.02, against
            0.23 at dim 128 with ``fixed``, where xIELU starts almost linear
            (``docs/results.md``, ``python -m scripts.study.operating_regime``).
        init_reference_dim: the width ``init_std`` is meant for (1536: the paper's 1.1B).
        vocab_multiple: padding multiple for a tokenizer-derived vocabulary (128: a multiple of
            every tensor-core tile size and of 8-way tensor parallel shards).
        parametrization: ``standard`` (the paper's) or ``mup``, the maximal-update
            parametrization (Tensor Programs V) with ``mup_base_dim`` the width the
            hyperparameters were tuned at: hidden matrices start at ``init_std`` times
            sqrt(base / dim) and train at ``lr`` x base / dim with weight decay x dim / base;
            the logits are multiplied by base / dim; embeddings, norms, the LM head's weight
            and the activation's scalars keep their width-independent initialisation and
            rate. Width grows through ``dim``, the MLP width and the number of heads, at a
            fixed ``head_dim``, so the attention scale 1/sqrt(head_dim) is already µP's.
            Identical to ``standard`` at ``dim == mup_base_dim``. The derivation: docs/model.md.
        mup_base_dim: the base width of ``mup`` (required there).
        loss_chunk_tokens: tokens per chunk of the fused LM-head cross-entropy (``model/loss.py``);
            the loss holds about 6 bytes (eager) or 4 (compiled) per token of a chunk and entry
            of the vocabulary. Every chunk reads the head's weight twice and adds its vocab x dim
            weight gradient to the fp32 sum, so fewer, larger chunks are faster: the paper's
            presets take 4096 (+2.8 GiB at 1.1B against 1024; ``python -m scripts.bench.loss``
            times the choice).
    """

    vocab_size: int | None = None
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    gated_hidden: int = 1024
    mlp_hidden: int | None = None
    activation: str = "xielu"
    activation_kwargs: dict = field(default_factory=dict)
    rope_theta: float = 500000.0
    rope_scaling_factor: float = 1.0
    rope_scaling: str = "linear"
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_seq_len: int = 8192
    attention: str = "auto"
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    qk_norm: bool = False
    max_seq_len: int = 4096
    init_std: float = 0.02
    init_scaling: str = "fixed"
    init_reference_dim: int = 1536
    vocab_multiple: int = 128
    loss_chunk_tokens: int = 1024
    parametrization: str = "standard"
    mup_base_dim: int | None = None

    def check(self, run: Run | None = None) -> None:
        for f in fields(self):  # every number of the model is a count or a positive float
            value = getattr(self, f.name)
            if isinstance(value, float):
                positive(f"model.{f.name}", value)
            elif isinstance(value, int) and not isinstance(value, bool):
                at_least(f"model.{f.name}", value, 1)
        one_of("model.init_scaling", self.init_scaling, ("fixed", "width"))
        if self.dim % self.n_heads:
            raise ConfigError(
                f"model.dim={self.dim} is not divisible by model.n_heads={self.n_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"RoPE needs an even head dimension, got {self.head_dim}")
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"model.n_heads={self.n_heads} is not a multiple of model.n_kv_heads="
                f"{self.kv_heads}: each key/value head serves a whole group of query heads"
            )
        one_of("model.attention", self.attention, KERNELS)
        one_of("model.rope_scaling", self.rope_scaling, ("linear", "llama3"))
        if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise ConfigError(
                f"model.rope_low_freq_factor={self.rope_low_freq_factor} must be positive and "
                f"below model.rope_high_freq_factor={self.rope_high_freq_factor}"
            )
        try:
            is_gated(self.activation)  # raises with the list of valid names
        except ValueError as error:
            raise ConfigError(str(error)) from None
        try:
            check_options(self.activation, dict(self.activation_kwargs))
        except ValueError as error:
            raise ConfigError(
                f"model.activation_kwargs={dict(self.activation_kwargs)} for model.activation="
                f"{self.activation}: {error}"
            ) from None
        one_of("model.parametrization", self.parametrization, ("standard", "mup"))
        if self.parametrization == "mup":
            if self.mup_base_dim is None or self.mup_base_dim <= 0:
                raise ConfigError(
                    "model.parametrization=mup needs model.mup_base_dim, the positive width "
                    f"the hyperparameters were tuned at (got {self.mup_base_dim})"
                )
            if self.init_scaling != "fixed":
                raise ConfigError(
                    "model.parametrization=mup scales the hidden matrices' initialisation with "
                    f"width itself: model.init_scaling={self.init_scaling!r} would scale it "
                    "twice; use model.init_scaling=fixed"
                )
            # one multiplier m = dim / base scales every hidden fan-in, so the base model is
            # this one with every width dimension times 1/m: it must exist
            base, head_dim = self.mup_base_dim, self.dim // self.n_heads
            if base % head_dim:
                raise ConfigError(
                    f"model.mup_base_dim={base} is not a multiple of the head dimension "
                    f"{head_dim} (model.dim / model.n_heads): µP scales the number of heads at a "
                    "fixed head_dim, and the base model would have a fraction of a head"
                )
            if (self.kv_heads * base) % self.dim:
                raise ConfigError(
                    f"model.n_kv_heads={self.kv_heads} does not scale with model.dim={self.dim} "
                    f"to a whole number of key/value heads at model.mup_base_dim={base}"
                )
            if (self.hidden * base) % self.dim:
                raise ConfigError(
                    f"the MLP width {self.hidden} (model.gated_hidden or model.mlp_hidden) does "
                    f"not scale with model.dim={self.dim} to a whole width at "
                    f"model.mup_base_dim={base}: µP scales it by the same multiplier as dim"
                )

    @property
    def width_multiplier(self) -> float:
        """dim / mup_base_dim under µP, 1 under the standard parametrization."""
        return self.dim / self.mup_base_dim if self.parametrization == "mup" else 1.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        """The key/value heads built: ``n_kv_heads``, or ``n_heads`` when unset."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key and value projections."""
        return self.kv_heads * self.head_dim

    @property
    def gated(self) -> bool:
        return is_gated(self.activation)

    @property
    def effective_init_std(self) -> float:
        """The initialisation's standard deviation at this width (``init_scaling``)."""
        if self.init_scaling == "width":
            return self.init_std * (self.init_reference_dim / self.dim) ** 0.5
        return self.init_std

    @property
    def hidden(self) -> int:
        """The MLP width actually built."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.gated:
            return self.gated_hidden
        return round(self.gated_hidden * PLAIN_TO_GATED_WIDTH)

    def check_vocabulary(self, tokenizer_vocab: int) -> None:
        """An explicit ``vocab_size`` must hold the tokenizer's ids (step 1 would index past)."""
        if self.vocab_size is not None and self.vocab_size < tokenizer_vocab:
            raise ConfigError(
                f"model.vocab_size={self.vocab_size} is smaller than the tokenizer's "
                f"vocabulary ({tokenizer_vocab} ids): leave it unset to take the tokenizer's "
                f"(padded to model.vocab_multiple) or set at least {tokenizer_vocab}"
            )

    def with_vocab_from_tokenizer(self, tokenizer_vocab: int) -> ModelConfig:
        """This config with ``vocab_size`` taken from a tokenizer unless already set."""
        if self.vocab_size is not None:
            return self
        return replace(self, vocab_size=pad_vocab(tokenizer_vocab, self.vocab_multiple))
