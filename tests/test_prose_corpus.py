"""The prose corpus builder's cleaning, on constructed text (the download needs a registry)."""

import json

from scripts.build_prose_corpus import bible_chapters, rst_prose, split_document

RST = """
Locking primitives
==================

The kernel provides a variety of :ref:`locking primitives <locks>` which can be divided
into three categories, described in ``locktypes.rst`` and *elsewhere*.

.. note::

   A directive body is indented and dropped.

An example follows::

    spin_lock(&lock);
    spin_unlock(&lock);

- a list item that is short.

=====  =====
table  cells
=====  =====

See `the documentation <https://kernel.org>`_ for the details of every lock type in use.
"""


def test_rst_prose_keeps_the_paragraphs_and_the_text_of_inline_markup():
    prose = rst_prose(RST).split("\n\n")
    assert prose == [
        "The kernel provides a variety of locking primitives which can be divided into three "
        "categories, described in locktypes.rst and elsewhere.",
        "See the documentation for the details of every lock type in use.",
    ]


def test_long_texts_are_split_between_paragraphs_and_nothing_is_lost():
    paragraphs = [f"paragraph {i} " + " ".join(["word"] * (i % 7 + 5)) for i in range(60)]
    text = "\n\n".join(paragraphs)
    documents = split_document(text, limit=300)
    assert all(len(d) <= 300 + 60 for d in documents) and len(documents) > 5
    assert "\n\n".join(documents).split("\n\n") == paragraphs


def test_bible_verses_become_one_document_per_chapter():
    verses = [
        {"book": "Genesis", "chapter": 1, "verse": 1, "text": "In the beginning."},
        {"book": "Genesis", "chapter": 1, "verse": 2, "text": "And the earth."},
        {"book": "Genesis", "chapter": 2, "verse": 1, "text": "Thus the heavens."},
    ]
    jsonl = "\n".join(json.dumps(v) for v in verses)
    assert bible_chapters(jsonl) == [
        ("Genesis 1", "In the beginning. And the earth."),
        ("Genesis 2", "Thus the heavens."),
    ]
