"""What counts as a document: the one rule every source applies to a record's text.

Text enters the pipeline here and nowhere else, so a record that one tokenizer cannot encode is
skipped by every source, whatever the tokenizer: it is counted as bad, never stops a run (a
rerun would stop at the same record again) and never reaches a tokenizer.
"""

from __future__ import annotations

BAD = "bad_records"  # not a string, or not encodable as UTF-8
EMPTY = "empty_documents"  # empty or whitespace-only


def document_text(text: object) -> tuple[str | None, str | None]:
    """``(text, None)`` for a document, else ``(None, counter)`` naming why it is skipped.

    A lone surrogate (``"\\ud800"``) is valid JSON, common in scraped web text, and has no UTF-8
    encoding: the ``bytes`` tokenizer raised on it and tiktoken replaced it, so it is bad for all.
    """
    if not isinstance(text, str):
        return None, BAD
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None, BAD
    if not text.strip():
        return None, EMPTY
    return text, None
