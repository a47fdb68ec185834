"""The paper's tokenizers against the packages' own implementations, on real text."""

import pytest

from data import TokenizerConfig, load_tokenizer
from data_fixtures import real_documents


def test_tekken_fast_path_equals_mistral_common_tekkenizer():
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    from data.tokenizers import TEKKEN_FILE, package_file

    ours = load_tokenizer(TokenizerConfig("mistral_nemo"))
    theirs = Tekkenizer.from_file(str(package_file(*TEKKEN_FILE)))
    assert (ours.vocab_size, ours.bos_id, ours.eos_id) == (131072, theirs.bos_id, theirs.eos_id)
    for text in real_documents():
        assert ours.encode(text) == theirs.encode(text, bos=False, eos=False)
    assert ours.decode(ours.encode("Gradient-designed ReLU² ✓")) == "Gradient-designed ReLU² ✓"


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
    with pytest.raises(ValueError, match=r"data\.tokenizer\.name='gpt2' is not known"):
        TokenizerConfig("gpt2")
    with pytest.raises(ValueError, match=r"data\.tokenizer\.path is required"):
        TokenizerConfig("sentencepiece")
