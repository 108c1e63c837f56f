"""Checking a definition's rules statically, when the file is read (Spark's analyzer comes later).

A rule is a Spark SQL boolean expression over the declared fields
(``check: "dwell_ms >= 0"``). Two checks, in this order:

:func:`static_rule_problem` needs no Spark. It reads the expression with sqlglot's
Spark dialect and finds, in a millisecond, what a user gets wrong most: a name
that is not a declared field, an aggregate or window function (a rule sees one
record), and an expression whose type is known and is not boolean
(``dwell_ms + 1``). It refuses only what it is sure of: an expression it cannot
read, a function it does not know, or a type it cannot infer passes to Spark.
:func:`streamlake.pipeline.definition.load_definition` runs it, so every reader of a
definition (the CLI, the DAG processor's parse of ``pipelines/``, the views) refuses
these files the same way.

:func:`streamlake.pipeline.definition_check.check_rules` then asks Spark's
analyzer, the authority on Spark's own syntax, functions and argument types,
before a command writes anything.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from streamlake.pipeline.types import FieldType

log = logging.getLogger(__name__)

_TABLE = "_fields"  # the name the static analysis gives the typed fields' row


def _kind_of(sqlglot_type) -> str | None:
    """What a statically inferred type is, in words, when it is surely not a boolean (None: a
    boolean, or not known)."""
    from sqlglot import exp

    t = exp.DataType.Type
    if sqlglot_type is None or sqlglot_type.this in (t.BOOLEAN, t.UNKNOWN, t.NULL):
        return None
    if sqlglot_type.this in exp.DataType.NUMERIC_TYPES:
        return "a number"
    if sqlglot_type.this in exp.DataType.TEXT_TYPES:
        return "a string"
    if sqlglot_type.this in exp.DataType.TEMPORAL_TYPES:
        return "a date or time"
    return None


def static_rule_problem(check: str, fields: "dict[str, FieldType]") -> str | None:
    """What is surely wrong with the rule expression ``check`` over the declared ``fields``
    (name -> type), or None.

    Finds, without Spark: a column that is not a declared field (Spark resolves names
    without regard to case, and so does this), an aggregate, window or generator function,
    and an expression whose type is known and not boolean. Never raises: an expression
    sqlglot cannot read is left to Spark's analyzer (:func:`check_rules`)."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        expression = sqlglot.parse_one(check, read="spark")
    except (SqlglotError, ValueError, TypeError) as exc:
        log.debug("rule %r: left to Spark's analyzer (sqlglot: %s)", check, exc)
        return None
    declared = {name.lower() for name in fields}
    lambda_names = {str(p.name).lower() for lam in expression.find_all(exp.Lambda) for p in lam.expressions}
    unknown = []
    for column in expression.find_all(exp.Column):
        name = column.sql(dialect="spark") if column.table else column.name
        if column.table or (name.lower() not in declared and name.lower() not in lambda_names):
            if name not in unknown:
                unknown.append(name)
    if unknown:
        names = ", ".join(fields)
        return (f"{', '.join(unknown)} {'is not a declared field' if len(unknown) == 1 else 'are not declared fields'}"
                f" (the fields: {names})")
    per_record = [node for node in expression.find_all(exp.AggFunc, exp.Window, exp.Explode, exp.Posexplode)]
    if per_record:
        return (f"{per_record[0].sql(dialect='spark')} is an aggregate, window or generator function; a rule "
                "tests one record")
    from sqlglot.optimizer.annotate_types import annotate_types
    from sqlglot.optimizer.qualify import qualify
    from sqlglot.schema import MappingSchema

    schema = MappingSchema({_TABLE: {name: t.sql for name, t in fields.items()}}, dialect="spark")
    try:
        query = qualify(exp.select(expression.copy().as_("_rule")).from_(_TABLE), schema=schema, dialect="spark")
        kind = _kind_of(annotate_types(query, schema=schema, dialect="spark").selects[0].type)
    except (SqlglotError, ValueError, TypeError, KeyError) as exc:
        log.debug("rule %r: type left to Spark's analyzer (sqlglot: %s)", check, exc)
        return None
    if kind:
        return f"it computes {kind}, not a boolean (a rule is TRUE to pass, FALSE or NULL to quarantine)"
    return None
