"""Field types of a pipeline definition: Spark SQL type names, their Arrow and Spark forms.

A definition declares each field's type with a Spark SQL type name
(``string``, ``boolean``, ``int``, ``bigint``, ``double``, ``decimal(p,s)``,
``date``, ``timestamp``), the names users of Spark and Databricks write in DDL.
:func:`parse_type` turns such a name into a :class:`FieldType`, which knows the
column's Arrow type (Delta tables are written with pyarrow and delta-rs), its
Spark SQL name (casts, ``try_variant_get``) and what a measure over it may do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamlake.errors import InvalidOptionError

if TYPE_CHECKING:
    import pyarrow as pa

SIMPLE_TYPES = ("string", "boolean", "int", "bigint", "double", "date", "timestamp")
KNOWN_TYPES = "string, boolean, int, bigint, double, decimal(p,s), date, timestamp"
_DECIMAL = re.compile(r"^decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
MAX_PRECISION = 38
# Sums are exact decimals: a double is summed at this scale (rounded half-up), as gold did before.
DOUBLE_SUM_SCALE = 9


@dataclass(frozen=True)
class FieldType:
    """A declared field type. ``kind`` is one of SIMPLE_TYPES or ``decimal``."""

    kind: str
    precision: int | None = None
    scale: int | None = None

    @property
    def sql(self) -> str:
        """The Spark SQL name, normalized (``decimal(12,2)``)."""
        return f"decimal({self.precision},{self.scale})" if self.kind == "decimal" else self.kind

    def __str__(self) -> str:
        return self.sql

    @property
    def arrow(self) -> pa.DataType:
        # pyarrow on first use, not at import: a definition is parsed where Arrow is never
        # needed (every task of a pipeline's DAGs parses its DAG file, the DAG processor)
        import pyarrow as pa

        return {
            "string": pa.string(), "boolean": pa.bool_(), "int": pa.int32(), "bigint": pa.int64(),
            "double": pa.float64(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
        }.get(self.kind) or pa.decimal128(self.precision, self.scale)

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "bigint", "double", "decimal")

    @property
    def integral(self) -> bool:
        return self.kind in ("int", "bigint")

    @property
    def orderable(self) -> bool:
        """min/max make sense: numbers, strings, dates, times."""
        return self.kind != "boolean"

    @property
    def sum_type(self) -> "FieldType":
        """The exact type a sum of this type is kept in: decimal(38, s) (s = 0 for integers,
        the declared scale for decimals, 9 for doubles). Raises ValueError if not numeric."""
        if not self.numeric:
            raise ValueError(f"{self.sql} values cannot be summed")
        scale = 0 if self.integral else self.scale if self.kind == "decimal" else DOUBLE_SUM_SCALE
        return FieldType("decimal", MAX_PRECISION, scale)


def parse_type(text) -> FieldType:
    """A Spark SQL type name (case-insensitive) as a FieldType. Raises InvalidOptionError
    naming the known types."""
    name = str(text).strip().lower() if text is not None else ""
    if name in SIMPLE_TYPES:
        return FieldType(name)
    match = _DECIMAL.match(name)
    if match:
        precision, scale = int(match.group(1)), int(match.group(2))
        if not 1 <= precision <= MAX_PRECISION or scale > precision:
            raise InvalidOptionError(f"decimal({precision},{scale}): precision must be 1..{MAX_PRECISION} and the "
                                     "scale at most the precision")
        return FieldType("decimal", precision, scale)
    raise InvalidOptionError(f"unknown type {text!r} (known: {KNOWN_TYPES})")
