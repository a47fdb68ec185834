"""A streamed source survives connection errors mid-epoch, exactly, and gives up clearly.

Local parquet files streamed through ``datasets`` (the ``fineweb_edu`` source with
``data.paths``: the Hub's code path without the network), with a connection error injected into
``datasets``' parquet reader after some windows.
"""

import httpx
import pytest
import requests
import torch
from datasets.packaged_modules.parquet.parquet import Parquet

from data import DataConfig
from data.sources import fineweb_edu
from data.sources.fineweb_edu import HubStream, HubStreamError, is_connection_error
from data_fixtures import write_parquet_corpus


@pytest.fixture(scope="module")
def parquet_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fineweb")
    write_parquet_corpus(directory, files=3, row_group_size=20)
    return [str(p) for p in sorted(directory.glob("*.parquet"))]


def config(paths, **overrides) -> DataConfig:
    base = dict(source="fineweb_edu", paths=paths, seq_len=64, validation_documents=10)
    return DataConfig(**{**base, **overrides})


class FlakyReader:
    """Makes the next ``failures`` reads of a parquet record batch raise once ``armed``."""

    def __init__(self, monkeypatch) -> None:
        self.armed, self.failures, self.sleeps = False, 0, []
        read = Parquet._generate_tables

        def flaky(builder, *args, **kwargs):
            for table in read(builder, *args, **kwargs):
                if self.armed and self.failures > 0:
                    self.failures -= 1
                    raise ConnectionError("Server Disconnected")
                yield table

        monkeypatch.setattr(Parquet, "_generate_tables", flaky)
        monkeypatch.setattr(fineweb_edu, "sleep", self.sleeps.append)


def take(iterator, n: int) -> list[dict]:
    return [next(iterator) for _ in range(n)]


@pytest.mark.slow
def test_connection_errors_mid_epoch_are_retried_from_the_last_record(parquet_files, monkeypatch):
    reference = take(iter(HubStream(config(parquet_files))), 400)  # an epoch is ~280 windows
    flaky = FlakyReader(monkeypatch)
    stream = iter(HubStream(config(parquet_files)))
    got = take(stream, 100)
    flaky.armed, flaky.failures = True, 2  # the next read fails, and the first retry too
    got += take(stream, 300)
    assert flaky.failures == 0 and flaky.sleeps == [2.0, 4.0]  # backoff doubles
    for a, b in zip(got, reference, strict=True):
        assert torch.equal(a["inputs"], b["inputs"]) and torch.equal(a["targets"], b["targets"])


def test_a_persistent_connection_error_stops_after_the_retries_naming_the_files(
    parquet_files, monkeypatch
):
    flaky = FlakyReader(monkeypatch)
    stream = iter(HubStream(config(parquet_files, hub_retries=3, hub_backoff_s=0.5)))
    take(stream, 20)
    flaky.armed, flaky.failures = True, 10**9
    with pytest.raises(HubStreamError, match="failed 4 times in a row") as error:
        take(stream, 300)
    assert flaky.sleeps == [0.5, 1.0, 2.0]
    message = str(error.value)
    assert parquet_files[0] in message and "ConnectionError: Server Disconnected" in message
    assert "data.hub_retries=3" in message and "resumes exactly" in message
    assert "data=local" in message  # the way out when the Hub stays down


def test_only_connection_errors_are_retried():
    class Answer:
        def __init__(self, status_code: int) -> None:
            self.status_code = status_code

    def http_error(status: int) -> OSError:
        error = OSError(f"HTTP {status}")
        error.response = Answer(status)
        return error

    retried = [
        ConnectionError("Server Disconnected"),
        TimeoutError(),
        httpx.ConnectError("refused"),
        requests.exceptions.ConnectionError(),
        http_error(503),
        http_error(429),
    ]
    assert all(is_connection_error(error) for error in retried)
    final = [FileNotFoundError("x.parquet"), http_error(404), ValueError("bad parquet")]
    assert not any(is_connection_error(error) for error in final)
