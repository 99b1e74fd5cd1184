"""The backup file: gzip'd JSON lines, its trailer's SHA-256 over every line before it, and each column's values
as JSON (dates as ISO 8601, bytes as base64, JSON columns as their JSON text, so SQL NULL stays apart from a
JSON null).
"""

import base64
import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Callable, Iterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa

from webapp.backup import BackupError

FORMAT = "cairn-backup"
FORMAT_VERSION = 1
GZIP_MAGIC = b"\x1f\x8b"
COMPRESSION = 6  # gzip's level: 9 is a third slower for a file a few percent smaller


def is_json(column: sa.Column) -> bool:
    return isinstance(column.type, sa.JSON)


def _encoder(column: sa.Column) -> Callable[[Any], Any] | None:
    kind = column.type
    if isinstance(kind, sa.DateTime | sa.Date | sa.Time):
        return lambda value: value.isoformat()
    if isinstance(kind, sa.LargeBinary):
        return lambda value: base64.b64encode(value).decode()
    if isinstance(kind, sa.Numeric) and not isinstance(kind, sa.Float):
        return str
    return None


def _decoder(column: sa.Column) -> Callable[[Any], Any] | None:
    kind = column.type
    if isinstance(kind, sa.DateTime):
        return datetime.fromisoformat
    if isinstance(kind, sa.Date):
        return date.fromisoformat
    if isinstance(kind, sa.LargeBinary):
        return base64.b64decode
    if isinstance(kind, sa.Numeric) and not isinstance(kind, sa.Float):
        return Decimal
    return None


def encoder(columns: list[sa.Column]) -> Callable[[tuple], list]:
    """A row as read (JSON columns as text) -> its line's values."""
    each = [_encoder(column) for column in columns]
    return lambda row: [
        value if value is None or convert is None else convert(value)
        for value, convert in zip(row, each, strict=True)
    ]


def decoder(columns: list[sa.Column]) -> Callable[[list], list]:
    """A line's values -> what the database is given."""
    each = [_decoder(column) for column in columns]
    return lambda values: [
        value if value is None or convert is None else convert(value)
        for value, convert in zip(values, each, strict=True)
    ]


def _line(item: object) -> bytes:
    return (json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class Writer:
    """Writes lines to a file beside the one named, which takes its name once the trailer is written: an export
    that stops midway leaves no file that looks whole."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._partial = self.path.with_name(f".{self.path.name}.partial")
        try:
            # Read and written by its owner alone: it holds password hashes and encrypted keys.
            descriptor = os.open(self._partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            self._raw: IO[bytes] = os.fdopen(descriptor, "wb")
        except OSError as error:
            raise BackupError(f"Cannot write {self.path}: {error.strerror}.") from None
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=COMPRESSION, mtime=0)
        self._digest = hashlib.sha256()

    def write(self, item: object) -> None:
        line = _line(item)
        self._digest.update(line)
        self._gzip.write(line)

    def finish(self, rows: dict[str, int]) -> None:
        self._gzip.write(_line({"end": {"rows": rows, "sha256": self._digest.hexdigest()}}))
        self._gzip.close()
        self._raw.close()
        os.replace(self._partial, self.path)

    def abandon(self) -> None:
        self._gzip.close()
        self._raw.close()
        self._partial.unlink(missing_ok=True)


class Reader:
    """The lines of a backup, parsed, then checked against its trailer (the last one) once all are read.
    `position()` is how many of the file's (compressed) bytes are read, for a progress bar."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise BackupError(f"There is no file {self.path}.")
        self.size = self.path.stat().st_size
        with open(self.path, "rb") as start:
            if start.read(2) != GZIP_MAGIC:
                raise BackupError(f"{self.path} is not a Cairn backup (a backup is gzip'd JSON lines).")
        self.trailer: dict | None = None

    def position(self) -> int:
        return self._raw.tell()

    def items(self) -> Iterator[Any]:
        """Every line before the trailer, parsed; raises BackupError when the file is not a whole backup."""
        digest = hashlib.sha256()
        with open(self.path, "rb") as self._raw, gzip.GzipFile(fileobj=self._raw, mode="rb") as lines:
            try:
                for number, line in enumerate(lines, 1):
                    item = _parsed(line, number)
                    if isinstance(item, dict) and "end" in item:
                        self._check_trailer(item["end"], digest, lines)
                        return
                    digest.update(line)
                    yield item
            except (OSError, EOFError, zlib.error) as error:
                raise BackupError(f"{self.path} is damaged or cut short ({error}).") from None
        raise BackupError(f"{self.path} is cut short: it ends before its last line (its trailer).")

    def _check_trailer(self, trailer: object, digest, rest: IO[bytes]) -> None:
        if not isinstance(trailer, dict) or not isinstance(trailer.get("rows"), dict):
            raise BackupError(f"{self.path} is not a Cairn backup: its last line is not a trailer.")
        if trailer.get("sha256") != digest.hexdigest():
            raise BackupError(
                f"{self.path} was changed after it was written: its contents do not match the SHA-256 its "
                "last line records."
            )
        if rest.read(1):
            raise BackupError(f"{self.path} goes on after its last line (its trailer): it was changed.")
        self.trailer = trailer


def _parsed(line: bytes, number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        if number == 1:
            raise BackupError("The file is not a Cairn backup (its first line is not JSON).") from None
        raise BackupError(
            f"Line {number} of the file is not JSON: the file was changed or is damaged."
        ) from None


def check_header(item: object) -> dict:
    """The header's fields, once it is found to be a backup of a format this Cairn reads."""
    if not isinstance(item, dict) or item.get("format") != FORMAT:
        raise BackupError("The file is not a Cairn backup (its first line does not say so).")
    if item.get("version") != FORMAT_VERSION:
        raise BackupError(
            f"The file is a Cairn backup of format {item.get('version')}, which this Cairn cannot read (it reads "
            f"format {FORMAT_VERSION}): import it with the Cairn that wrote it ({item.get('cairn')})."
        )
    return item
