"""Sources read from text files (``builtin``, ``local``, any other): one rule for all of them.

A text-file source differs from another only in which files it opens (``open_files``:
``config`` -> :class:`TextSource`); :func:`text_file_source` builds its training stream,
held-out windows, pretokenization and re-partitioning around that opener, so a new one is a
module under ``data/sources/`` that registers ``text_file_source(name, summary, open_files)``.

Held out: the first ``validation_documents`` documents in the global (file) order. Skipped
records (bad, empty, filtered by ``min_int_score``) among them do not count, so the slice holds
exactly that many documents, like the tokenized source, which counts EOS tokens.

Sharding (``data.partition``): the ``n = world_size * workers`` streams partition the documents.
With at least ``n`` fragments, stream ``s`` reads fragments ``s, s + n, ...`` of the epoch's
order (no stream opens another's files); with fewer, every stream opens every fragment and keeps
rows with ``(fragment + row) % n == s``. Either way each document goes to exactly one stream, and
each skipped record is counted exactly once: by the stream that owns its row, and only outside
the held-out slice (training never reads that slice; the validation pass counts nothing).

State (``data.resumable``): a handful of integers (epoch, fragment position, next row), the
packer's token buffer, the counters, and a fingerprint of the source, stream layout and
tokenizer, so a resume on different data is refused instead of silently misaligned. A resume on
another world size or number of workers re-partitions the streams' positions
(``data.text.repartition``, by the rule of ``data.repartition``): a new stream first reads its
*carry-over*, the items it was dealt (``carry``, ``carry_done``, ``carry_row``: which are read
and the next row of the current one), then the new layout's epochs.
"""

from data.text.files import TextSource, local_files
from data.text.source import text_file_source
from data.text.stream import TextStream

__all__ = ["TextSource", "TextStream", "local_files", "text_file_source"]
