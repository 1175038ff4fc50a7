"""GSM8K and MATH problems as `MathExample` records.

Sources and what the gold answer is:
  * GSM8K (`question`, `answer`): the answer text ends with `#### N`; gold is N with
    thousands separators removed (`#### 1,250` -> `1250`).
  * MATH (`problem`, `solution`, `level`, `type`): gold is the argument of the last
    `\\boxed{...}` (or `\\fbox{...}`) in the solution, braces matched properly, so
    `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. The brace-less TeX form `\\boxed 5` is
    accepted too (a few MATH solutions use it).

Where the records come from is named by a *spec* string:
  * `path/to/train.jsonl` or `.json` (one JSON object per line; a `.json` file whose text
    starts with `[` is read as one JSON array of records) or `.parquet` (read with pyarrow);
  * `gsm8k:path` / `math:path` names the source explicitly; without the prefix it is
    inferred from the first record's fields (`question`+`answer` -> gsm8k,
    `problem`+`solution` -> math);
  * `tfds:NAME[:SPLIT][@DATA_DIR]` reads a prepared TFDS dataset with `tfds.data_source`
    (random access; the dataset must have been prepared as array_record or parquet, nothing
    is downloaded). `gsm8k` is TFDS's GSM8K builder (defined in
    `tensorflow_datasets.text.gsm8k`, imported here so that the name is registered). TFDS
    ships no Hendrycks MATH builder (its `math_dataset` is DeepMind's, without worked
    solutions), so MATH in TFDS form means a user builder with the MATH fields; pass
    `math:tfds:NAME...` when the fields alone do not say which source it is.
A spec can also be a mapping `{"path": ..., "source": ...}` or
`{"tfds": NAME, "split": ..., "data_dir": ..., "source": ...}`.

Every malformed record fails with its location, e.g.
`gsm8k.jsonl:3: field 'answer' has no '#### ' final answer`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from derl_jax.config import InputError
from primitives.math_text import BOX_COMMANDS, last_boxed_content, strip_thousands_separators

SOURCES = ("gsm8k", "math")
JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIXES = (".parquet",)
GSM8K_ANSWER_MARK = "#### "


class MathDataError(InputError):
    """A data file or record that cannot be turned into `MathExample`s."""


@dataclasses.dataclass(frozen=True)
class MathExample:
    """One problem. `answer` is the gold final answer string, `solution` the full reference
    text (GSM8K: the whole answer field including `#### N`), `uid` unique within a load."""

    question: str
    answer: str
    solution: str
    source: str
    level: str | None
    subject: str | None
    uid: str


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """Where one set of problems comes from (see the module docstring for string forms)."""

    path: str | None = None
    tfds_name: str | None = None
    split: str = "train"
    data_dir: str | None = None
    source: str | None = None

    def __post_init__(self):
        if (self.path is None) == (self.tfds_name is None):
            raise MathDataError(f"data spec needs exactly one of a file path or a TFDS name, got {self}")
        if self.source is not None and self.source not in SOURCES:
            raise MathDataError(f"data spec {self}: source must be one of {SOURCES}, got {self.source!r}")

    @property
    def label(self) -> str:
        """Short name used in uids and error messages."""
        if self.path is not None:
            return os.path.basename(self.path)
        return f"{self.tfds_name}:{self.split}"


# ----------------------------------------------------------------------------- answers


def gsm8k_gold_answer(answer_text: str) -> str | None:
    """N from the last `#### N` line, thousands separators removed; None if absent or empty."""
    mark = answer_text.rfind(GSM8K_ANSWER_MARK.strip())
    if mark < 0:
        return None
    final = answer_text[mark + len(GSM8K_ANSWER_MARK.strip()) :].strip().splitlines()
    if not final or not final[0].strip():
        return None
    return strip_thousands_separators(final[0])


def math_gold_answer(solution: str) -> str | None:
    """The last boxed answer of a MATH solution; None if there is none or it is empty."""
    content = last_boxed_content(solution, BOX_COMMANDS, allow_bare=True)
    return content or None


# ----------------------------------------------------------------------------- records


def _field_text(record: Mapping[str, Any], field: str, where: str, required: bool = True) -> str | None:
    """`record[field]` as str (TFDS gives bytes); error naming `where` and the field."""
    if field not in record or record[field] is None:
        if required:
            raise MathDataError(f"{where}: missing field {field!r} (fields present: {sorted(record)})")
        return None
    value = record[field]
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value.item()
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise MathDataError(f"{where}: field {field!r} is not valid UTF-8 ({err})") from None
    if not isinstance(value, str):
        raise MathDataError(f"{where}: field {field!r} must be text, got {type(value).__name__}")
    return value


def _record_uid(record: Mapping[str, Any], source: str, label: str, index: int, where: str) -> str:
    own_id = None
    for key in ("unique_id", "id"):
        if key in record and record[key] is not None:
            own_id = _field_text(record, key, where)
            break
    return f"{source}:{own_id}" if own_id else f"{source}:{label}:{index}"


def gsm8k_example(record: Mapping[str, Any], where: str, uid: str) -> MathExample:
    """A GSM8K record (`question`, `answer` ending in `#### N`) as a MathExample."""
    question = _field_text(record, "question", where)
    answer_text = _field_text(record, "answer", where)
    gold = gsm8k_gold_answer(answer_text)
    if gold is None:
        short = _field_text(record, "short_answer", where, required=False)
        if short is None or not short.strip():
            raise MathDataError(f"{where}: field 'answer' has no {GSM8K_ANSWER_MARK!r} final answer")
        gold = strip_thousands_separators(short)
    if not question.strip():
        raise MathDataError(f"{where}: field 'question' is empty")
    return MathExample(question, gold, answer_text, "gsm8k", None, None, uid)


def math_example(record: Mapping[str, Any], where: str, uid: str) -> MathExample:
    """A MATH record (`problem`, `solution` with a boxed answer, `level`, `type`)."""
    problem = _field_text(record, "problem", where)
    solution = _field_text(record, "solution", where)
    gold = math_gold_answer(solution)
    if gold is None:
        raise MathDataError(f"{where}: field 'solution' has no non-empty \\boxed{{...}} answer with balanced braces")
    if not problem.strip():
        raise MathDataError(f"{where}: field 'problem' is empty")
    level = _field_text(record, "level", where, required=False)
    subject = _field_text(record, "type", where, required=False)
    if subject is None:
        subject = _field_text(record, "subject", where, required=False)
    return MathExample(problem, gold, solution, "math", level, subject, uid)


def infer_source(record: Mapping[str, Any], where: str) -> str:
    """`gsm8k` or `math` from a record's field names."""
    if "problem" in record and "solution" in record:
        return "math"
    if "question" in record and "answer" in record:
        return "gsm8k"
    raise MathDataError(
        f"{where}: cannot tell the source from fields {sorted(record)}; expected 'question'+'answer' (gsm8k) "
        "or 'problem'+'solution' (math); name it with a 'gsm8k:' or 'math:' prefix"
    )


def record_to_example(record: Mapping[str, Any], source: str | None, where: str, label: str, index: int) -> MathExample:
    """One raw record (dict of str or bytes fields) -> MathExample; `where` prefixes errors."""
    if not isinstance(record, Mapping):
        raise MathDataError(f"{where}: record must be a JSON object, got {type(record).__name__}")
    source = source or infer_source(record, where)
    uid = _record_uid(record, source, label, index, where)
    if source == "gsm8k":
        return gsm8k_example(record, where, uid)
    if source == "math":
        return math_example(record, where, uid)
    raise MathDataError(f"{where}: unknown source {source!r}; expected one of {SOURCES}")


# ----------------------------------------------------------------------------- files


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"math data file {path!r} does not exist")
    if not os.path.isfile(path):
        raise MathDataError(f"math data path {path!r} is not a file")
    if os.path.getsize(path) == 0:
        raise MathDataError(f"math data file {path!r} is empty")


def _jsonl_records(path: str) -> Iterator[tuple[str, Any]]:
    """(location, record) for each non-blank line; location is `file:LINE` (1-based)."""
    name = os.path.basename(path)
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise MathDataError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x})") from None
    if path.lower().endswith(".json") and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise MathDataError(f"{name}:{err.lineno}: invalid JSON ({err.msg})") from None
        for number, record in enumerate(records, start=1):
            yield f"{name}:record {number}", record
        return
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise MathDataError(f"{name}:{line_number}: invalid JSON ({err.msg} at column {err.colno})") from None
        yield f"{name}:{line_number}", record


def _parquet_records(path: str) -> Iterator[tuple[str, Any]]:
    """(location, record) per row; location is `file:row N` (1-based)."""
    import pyarrow.parquet as pq

    name = os.path.basename(path)
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several error types for unreadable files
        raise MathDataError(f"{name}: not a readable Parquet file ({err})") from None
    for row, record in enumerate(table.to_pylist(), start=1):
        yield f"{name}:row {row}", record


def _file_records(path: str) -> Iterator[tuple[str, Any]]:
    lower = path.lower()
    if lower.endswith(JSONL_SUFFIXES):
        return _jsonl_records(path)
    if lower.endswith(PARQUET_SUFFIXES):
        return _parquet_records(path)
    raise MathDataError(
        f"math data file {path!r}: unknown format; expected a name ending in {JSONL_SUFFIXES + PARQUET_SUFFIXES}"
    )


def _examples(records: Iterable[tuple[str, Any]], source: str | None, label: str, empty_name: str) -> list[MathExample]:
    examples = []
    for index, (where, record) in enumerate(records):
        if source is None:
            source = infer_source(record, where) if isinstance(record, Mapping) else source
        examples.append(record_to_example(record, source, where, label, index))
    if not examples:
        raise MathDataError(f"{empty_name} holds no records")
    _check_unique_uids(examples, empty_name)
    return examples


def _check_unique_uids(examples: Sequence[MathExample], name: str) -> None:
    seen: set[str] = set()
    for example in examples:
        if example.uid in seen:
            raise MathDataError(f"{name}: uid {example.uid!r} occurs more than once")
        seen.add(example.uid)


def load_file(path: str, source: str | None = None) -> list[MathExample]:
    """Every record of a JSONL / JSON / Parquet file; `source` None infers it."""
    _check_file(path)
    return _examples(_file_records(path), source, os.path.basename(path), f"math data file {path!r}")


def load_gsm8k(path: str) -> list[MathExample]:
    """GSM8K problems from a JSONL/JSON/Parquet file with fields `question`, `answer`."""
    return load_file(path, "gsm8k")


def load_math(path: str) -> list[MathExample]:
    """MATH problems from a JSONL/JSON/Parquet file with `problem`, `solution`, `level`, `type`."""
    return load_file(path, "math")


# ----------------------------------------------------------------------------- TFDS


def _import_tfds():
    """`tensorflow_datasets`, with the GSM8K builder registered (its module is not imported
    by `import tensorflow_datasets`)."""
    try:
        import tensorflow_datasets as tfds
        from tensorflow_datasets.text import gsm8k  # noqa: F401  (the import registers `gsm8k`)
    except ImportError as err:
        raise MathDataError(f"TFDS sources need tensorflow-datasets ({err})") from None
    return tfds


def tfds_records(name: str, split: str, data_dir: str | None) -> Iterator[tuple[str, Any]]:
    """(location, record) for each example of a prepared TFDS dataset; fields are bytes."""
    tfds = _import_tfds()
    root = os.path.expanduser(data_dir) if data_dir else os.path.expanduser(os.path.join("~", "tensorflow_datasets"))
    dataset_dir = os.path.join(root, name.split("/")[0])
    if not os.path.isdir(dataset_dir):
        raise FileNotFoundError(
            f"TFDS dataset {name!r} is not prepared under data_dir {root!r} (no folder {dataset_dir!r}); "
            "prepare it there with file_format='array_record' (nothing is downloaded at run time)"
        )
    try:
        source = tfds.data_source(name, split=split, data_dir=root, download=False)
    except Exception as err:  # tfds raises assorted types (NotImplementedError, AssertionError, ...)
        raise MathDataError(
            f"TFDS dataset {name!r} split {split!r} under {root!r} cannot be opened for random access "
            f"(prepare it with file_format='array_record' or 'parquet'): {err}"
        ) from None
    for index in range(len(source)):
        yield f"tfds {name}:{split}[{index}]", source[index]


# ----------------------------------------------------------------------------- specs


def parse_spec(spec: str | Mapping[str, Any] | DataSpec) -> DataSpec:
    """A `DataSpec` from its string or mapping form (module docstring)."""
    if isinstance(spec, DataSpec):
        return spec
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"path", "tfds", "split", "data_dir", "source"}
        if unknown:
            raise MathDataError(f"data spec {dict(spec)}: unknown keys {sorted(unknown)}")
        return DataSpec(
            path=spec.get("path"),
            tfds_name=spec.get("tfds"),
            split=spec.get("split", "train"),
            data_dir=spec.get("data_dir"),
            source=spec.get("source"),
        )
    if not isinstance(spec, str) or not spec.strip():
        raise MathDataError(f"data spec must be a non-empty string, mapping or DataSpec, got {spec!r}")
    text = spec.strip()
    source = None
    for candidate in SOURCES:
        if text.startswith(candidate + ":"):
            source, text = candidate, text[len(candidate) + 1 :]
            break
    if text.startswith("tfds:"):
        body, _, data_dir = text[len("tfds:") :].partition("@")
        name, _, split = body.partition(":")
        if not name:
            raise MathDataError(f"data spec {spec!r}: 'tfds:' needs a dataset name, e.g. 'tfds:gsm8k:train'")
        return DataSpec(tfds_name=name, split=split or "train", data_dir=data_dir or None, source=source)
    return DataSpec(path=text, source=source)


def load_dataset(spec: str | Mapping[str, Any] | DataSpec) -> list[MathExample]:
    """The problems a spec names (file or TFDS), in their stored order."""
    data = parse_spec(spec)
    if data.path is not None:
        return load_file(data.path, data.source)
    records = tfds_records(data.tfds_name, data.split, data.data_dir)
    return _examples(records, data.source, data.label, f"TFDS dataset {data.tfds_name!r} split {data.split!r}")


def load_mixture(specs: Sequence[str | Mapping[str, Any] | DataSpec], seed: int | None = None) -> list[MathExample]:
    """Problems of several specs (e.g. MATH + GSM8K), concatenated in spec order.

    With `seed`, the concatenation is shuffled by `np.random.default_rng(seed)`; either way
    the result depends only on the files and the seed. uids are checked to be unique.
    """
    if isinstance(specs, (str, Mapping, DataSpec)):
        specs = [specs]
    if not specs:
        raise MathDataError("load_mixture needs at least one data spec")
    examples: list[MathExample] = []
    for spec in specs:
        examples.extend(load_dataset(spec))
    _check_unique_uids(examples, f"mixture {list(specs)}")
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(examples))
        examples = [examples[i] for i in order]
    return examples
