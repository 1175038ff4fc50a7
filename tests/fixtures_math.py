"""Tiny GSM8K / MATH files for tests, and comparison functions for `AnswerChecker` tests.

The comparison functions live here (a module on the test path) because checker workers
import them by module path.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping, Sequence

GSM8K_RECORDS = (
    {
        "question": "Ann has 3 apples and buys 4 more. How many apples does she have?",
        "answer": "She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7",
    },
    {
        "question": "A shop sells 125 pens a day for 10 days. How many pens is that?",
        "answer": "125 * 10 = <<125*10=1250>>1250 pens.\n#### 1,250",
    },
    {
        "question": "The temperature fell from 2 degrees by 5 degrees. What is it now?",
        "answer": "2 - 5 = -3\n#### -3",
    },
)
GSM8K_GOLD = ("7", "1250", "-3")

MATH_RECORDS = (
    {
        "problem": "Simplify $\\frac{1}{\\sqrt{2}}$.",
        "solution": "Rationalise: $\\frac{1}{\\sqrt{2}} = \\boxed{\\frac{\\sqrt{2}}{2}}$.",
        "level": "Level 2",
        "type": "Algebra",
    },
    {
        "problem": "Which set is $\\{x : x^2 = 1\\}$?",
        "solution": "First $\\boxed{1}$ works, and so does $-1$, so the set is $\\boxed{\\{-1, 1\\}}$.",
        "level": "Level 3",
        "type": "Algebra",
    },
    {
        "problem": "What is $2 + 3$?",
        "solution": "We add to get $\\fbox{5}$.",
        "level": "Level 1",
        "type": "Prealgebra",
    },
    {
        "problem": "How many sides does a square have?",
        "solution": "A square has $\\boxed 4$ sides.",
        "level": "Level 1",
        "type": "Geometry",
    },
)
MATH_GOLD = ("\\frac{\\sqrt{2}}{2}", "\\{-1, 1\\}", "5", "4")


def write_jsonl(directory: str, name: str, records: Sequence[Mapping[str, Any]] = (), lines: Sequence[str] | None = None) -> str:
    """Write `records` (or raw `lines`) one per line to `directory/name`; return the path."""
    path = os.path.join(str(directory), name)
    rows = list(lines) if lines is not None else [json.dumps(r) for r in records]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(row + "\n" for row in rows))
    return path


def write_parquet(directory: str, name: str, records: Sequence[Mapping[str, Any]]) -> str:
    """Write `records` as one Parquet table to `directory/name`; return the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(str(directory), name)
    pq.write_table(pa.Table.from_pylist([dict(r) for r in records]), path)
    return path


def write_gsm8k_jsonl(directory: str, name: str = "gsm8k.jsonl") -> str:
    return write_jsonl(directory, name, GSM8K_RECORDS)


def write_math_jsonl(directory: str, name: str = "math.jsonl") -> str:
    return write_jsonl(directory, name, MATH_RECORDS)


def write_gsm8k_parquet(directory: str, name: str = "gsm8k.parquet") -> str:
    return write_parquet(directory, name, GSM8K_RECORDS)


def write_math_parquet(directory: str, name: str = "math.parquet") -> str:
    return write_parquet(directory, name, MATH_RECORDS)


SLOW_PREDICTION = "slow"


def reversed_compare(prediction: str, gold: str) -> bool:
    """Equal if `prediction` is `gold` backwards; hangs for a minute on `SLOW_PREDICTION`."""
    if prediction == SLOW_PREDICTION:
        time.sleep(60.0)
    return prediction == gold[::-1]


def raising_compare(prediction: str, gold: str) -> bool:
    """Raises on the prediction "boom", else plain equality of the reversed gold."""
    if prediction == "boom":
        raise ArithmeticError("cannot compare boom")
    return prediction == gold[::-1]
