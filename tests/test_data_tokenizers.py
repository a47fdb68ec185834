"""The paper's tokenizers against the packages' own implementations, on real text."""

import pytest

from data import TokenizerConfig, load_tokenizer
from data_fixtures import real_documents, shared_documents


@pytest.mark.slow
def test_tekken_fast_path_equals_mistral_common_tekkenizer():
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    from data.tokenizers import TEKKEN_FILE, package_file

    ours = load_tokenizer(TokenizerConfig("mistral_nemo"))
    theirs = Tekkenizer.from_file(str(package_file(*TEKKEN_FILE)))
    assert (ours.vocab_size, ours.bos_id, ours.eos_id) == (131072, theirs.bos_id, theirs.eos_id)
    for text in real_documents():
        assert ours.encode(text) == theirs.encode(text, bos=False, eos=False)
    assert ours.decode(ours.encode("Gradient-designed ReLU² ✓")) == "Gradient-designed ReLU² ✓"


@pytest.mark.shared_data
@pytest.mark.slow
def test_the_tokenizers_equal_their_packages_on_real_web_text():
    """The real FineWeb-Edu and C4 samples (web text: typographic quotes, dashes, non-English
    names), which the builtin corpus's documentation prose lacks."""
    from llama_models.llama3.tokenizer import Tokenizer as Llama3
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    from data.tokenizers import TEKKEN_FILE, package_file

    docs = shared_documents()
    assert len(docs) > 100 and any(not d.isascii() for d in docs)
    pairs = [
        (load_tokenizer(TokenizerConfig("llama3")), Llama3.get_instance()),
        (
            load_tokenizer(TokenizerConfig("mistral_nemo")),
            Tekkenizer.from_file(str(package_file(*TEKKEN_FILE))),
        ),
    ]
    for ours, theirs in pairs:
        for text in docs:
            assert ours.encode(text) == theirs.encode(text, bos=False, eos=False)
    byte = load_tokenizer(TokenizerConfig("bytes"))
    assert all(bytes(byte.encode(text)) == text.encode("utf-8") for text in docs)


def test_llama3_equals_llama_models_tokenizer():
    from llama_models.llama3.tokenizer import Tokenizer as Llama3

    ours = load_tokenizer(TokenizerConfig("llama3"))
    theirs = Llama3.get_instance()
    assert (ours.vocab_size, ours.bos_id, ours.eos_id) == (128256, 128000, 128001)
    assert (theirs.bos_id, theirs.eos_id) == (128000, 128001)
    for text in real_documents():
        assert ours.encode(text) == theirs.encode(text, bos=False, eos=False)


def test_sentencepiece_trained_here_loads_and_round_trips(tmp_path):
    from scripts.train_sentencepiece import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(real_documents()))
    model = train([str(corpus)], tmp_path / "sp", vocab_size=600)
    tok = load_tokenizer(TokenizerConfig("sentencepiece", path=str(model)))
    text = real_documents()[3]
    assert tok.vocab_size == 600 and tok.eos_id >= 0
    assert tok.decode(tok.encode(text)) == text


def test_local_hf_tokenizer_directory(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.train_from_iterator(
        real_documents(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"])
    )
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>").save_pretrained(tmp_path)
    tok = load_tokenizer(TokenizerConfig("hf", path=str(tmp_path)))
    assert tok.eos_id == bpe.token_to_id("</s>") and tok.vocab_size == 400
    assert tok.encode("the same text") == bpe.encode("the same text").ids


def test_byte_tokenizer_is_utf8_and_packs_like_the_others():
    from data.tokenizers import encode_document

    tok = load_tokenizer(TokenizerConfig("bytes"))
    for text in real_documents():
        assert bytes(tok.encode(text)) == text.encode("utf-8")
        assert tok.decode(tok.encode(text)) == text
    packed = encode_document(tok, "é!", add_bos=True)
    assert packed.tolist() == [256, 0xC3, 0xA9, 0x21, 257] and packed.dtype.name == "int64"
    assert tok.vocab_size == 258 and max(tok.bos_id, tok.eos_id) < tok.vocab_size


def test_tokenizer_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"data\.tokenizer\.name='gpt2' is not one of"):
        TokenizerConfig("gpt2")
    with pytest.raises(ValueError, match=r"data\.tokenizer\.path is required"):
        TokenizerConfig("sentencepiece")


# Decoding a sample: a model samples any id of its padded vocabulary.
# 147456: the paper's padded vocabulary, past both Tekken's and Llama 3's.
PADDED = 147456


@pytest.mark.parametrize("name", ["llama3", "mistral_nemo", "bytes"])
@pytest.mark.slow
def test_every_id_of_the_padded_vocabulary_decodes(name):
    tok = load_tokenizer(TokenizerConfig(name))
    ids = range(PADDED if name != "bytes" else 384)
    for i in ids:
        assert isinstance(tok.decode([i]), str)
    assert isinstance(tok.decode(list(ids)), str)
    for i in ids:
        assert isinstance(tok.decode([i], skip_special=True), str)


@pytest.mark.parametrize("name", ["llama3", pytest.param("mistral_nemo", marks=pytest.mark.slow)])
def test_a_tokenizer_pickles_with_its_special_names(name):
    """DataLoader workers under ``spawn`` (macOS, Windows) get the dataset pickled, tokenizer
    included; the special tokens' names are built lazily and must survive that."""
    import pickle

    tok = load_tokenizer(TokenizerConfig(name))
    ids = [tok.bos_id, tok.eos_id, tok.vocab_size - 1, 1000]
    assert pickle.loads(pickle.dumps(tok)).decode(ids) == tok.decode(ids)


def test_llama3_reserved_and_padding_ids_render_by_name_or_placeholder():
    from llama_models.llama3.tokenizer import Tokenizer as Llama3

    tok = load_tokenizer(TokenizerConfig("llama3"))
    hello = tok.encode("Hello world")
    sample = [128000, *hello[:1], 128207, *hello[1:], 128300, 128001]
    assert tok.decode(sample) == (
        "<|begin_of_text|>Hello<|reserved_special_token_197|> world<|padding:128300|>"
        "<|end_of_text|>"
    )
    assert tok.decode(sample, skip_special=True) == "Hello world"
    # every special id named as llama_models names it
    for text, i in Llama3.get_instance().special_tokens.items():
        assert tok.decode([i]) == text
    assert tok.decode(tok.encode("Gradient-designed ReLU² ✓")) == "Gradient-designed ReLU² ✓"


@pytest.mark.slow
def test_tekken_reserved_block_renders_as_mistral_common_names_it():
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    from data.tokenizers import TEKKEN_FILE, package_file

    ours = load_tokenizer(TokenizerConfig("mistral_nemo"))
    theirs = Tekkenizer.from_file(str(package_file(*TEKKEN_FILE)))
    sample = [1, *ours.encode("a reserved id"), 0, 11, 20, 999, *ours.encode(" here"), 2]
    keep = SpecialTokenPolicy.KEEP
    assert ours.decode(sample) == theirs.decode(sample, special_token_policy=keep)
    assert ours.decode(sample) == "<s>a reserved id<unk><pad><SPECIAL_20><SPECIAL_999> here</s>"
    assert ours.decode(sample, skip_special=True) == "a reserved id here"
    assert ours.decode([131072, 147455]) == "<|padding:131072|><|padding:147455|>"


def test_byte_tokenizer_names_bos_eos_and_padding():
    tok = load_tokenizer(TokenizerConfig("bytes"))
    sample = [256, *tok.encode("é!"), 300, 257]
    assert tok.decode(sample) == "<bos>é!<|padding:300|><eos>"
    assert tok.decode(sample, skip_special=True) == "é!"
    # bytes of one character on both sides of a dropped id still join up
    assert tok.decode([0xC3, 300, 0xA9], skip_special=True) == "é"
    with pytest.raises(ValueError, match="-100"):
        tok.decode([-100])


def test_sentencepiece_and_hf_decode_specials_and_padding(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from scripts.train_sentencepiece import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(real_documents()))
    sp = load_tokenizer(
        TokenizerConfig("sentencepiece", path=str(train([str(corpus)], tmp_path / "sp", 600)))
    )
    body = sp.encode("the model")
    eos = sp.processor.id_to_piece(sp.eos_id)
    assert sp.decode([*body, sp.eos_id, 640]) == f"the model{eos}<|padding:640|>"
    assert sp.decode([*body, sp.eos_id, 640], skip_special=True) == "the model"
    for i in range(640):
        assert isinstance(sp.decode([i]), str)

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        real_documents(), trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "</s>"])
    )
    hf_dir = tmp_path / "hf"
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="</s>").save_pretrained(hf_dir)
    hf = load_tokenizer(TokenizerConfig("hf", path=str(hf_dir)))
    body = hf.encode("the model")
    text = hf.decode(body)
    assert text.strip() == "the model"  # the byte-level pre-tokenizer adds a leading space
    assert hf.decode([*body, hf.eos_id, 450]) == f"{text}</s><|padding:450|>"
    assert hf.decode([*body, hf.eos_id, 450], skip_special=True) == text
    for i in range(512):
        assert isinstance(hf.decode([i]), str)
