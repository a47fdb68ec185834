"""``mixture``: windows drawn from several registered sources by weight (``data.sources``).

How the windows are drawn, resumed and re-partitioned: ``data.mixture``.
"""

from data import mixture
from data.registry import DataSource, register

register(
    DataSource(
        name="mixture",
        summary="a weighted mixture of the sources in data.sources, drawn by token",
        training=mixture.MixtureStream,
        validation=mixture.validation,
        check=mixture.check,
        check_tokenizer=mixture.check_tokenizer,
        repartition=mixture.repartition,
    )
)
