"""GSM8K / MATH loading: gold answers, formats, specs, mixtures, TFDS records, errors."""

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fixtures_math as fx
from derl_jax.domains import math_data as md


def test_gsm8k_jsonl_gold_answers_and_fields(tmp_path):
    examples = md.load_gsm8k(fx.write_gsm8k_jsonl(tmp_path))
    assert [e.answer for e in examples] == list(fx.GSM8K_GOLD)
    assert [e.question for e in examples] == [r["question"] for r in fx.GSM8K_RECORDS]
    assert [e.solution for e in examples] == [r["answer"] for r in fx.GSM8K_RECORDS]
    assert {e.source for e in examples} == {"gsm8k"}
    assert all(e.level is None and e.subject is None for e in examples)
    assert [e.uid for e in examples] == ["gsm8k:gsm8k.jsonl:0", "gsm8k:gsm8k.jsonl:1", "gsm8k:gsm8k.jsonl:2"]


def test_math_jsonl_gold_from_last_balanced_box(tmp_path):
    examples = md.load_math(fx.write_math_jsonl(tmp_path))
    assert [e.answer for e in examples] == list(fx.MATH_GOLD)
    assert [e.level for e in examples] == [r["level"] for r in fx.MATH_RECORDS]
    assert [e.subject for e in examples] == [r["type"] for r in fx.MATH_RECORDS]
    assert [e.solution for e in examples] == [r["solution"] for r in fx.MATH_RECORDS]
    assert {e.source for e in examples} == {"math"}


def test_parquet_gives_the_same_examples_as_jsonl(tmp_path):
    for write_jsonl, write_parquet in [(fx.write_gsm8k_jsonl, fx.write_gsm8k_parquet), (fx.write_math_jsonl, fx.write_math_parquet)]:
        from_jsonl = md.load_dataset(write_jsonl(tmp_path, "data.jsonl"))
        from_parquet = md.load_dataset(write_parquet(tmp_path, "data.parquet"))
        assert [(e.question, e.answer, e.solution, e.source, e.level, e.subject) for e in from_jsonl] == [
            (e.question, e.answer, e.solution, e.source, e.level, e.subject) for e in from_parquet
        ]


def test_json_array_file_is_read(tmp_path):
    path = tmp_path / "gsm8k.json"
    path.write_text(json.dumps(list(fx.GSM8K_RECORDS)))
    assert [e.answer for e in md.load_dataset(str(path))] == list(fx.GSM8K_GOLD)


def test_record_id_becomes_uid(tmp_path):
    record = dict(fx.MATH_RECORDS[2], unique_id="test/prealgebra/12.json")
    path = fx.write_jsonl(tmp_path, "m.jsonl", [record])
    assert md.load_math(path)[0].uid == "math:test/prealgebra/12.json"


def test_spec_forms_and_source_inference(tmp_path):
    gsm = fx.write_gsm8k_jsonl(tmp_path)
    maths = fx.write_math_parquet(tmp_path)
    assert md.load_dataset(gsm)[0].source == "gsm8k"
    assert md.load_dataset(maths)[0].source == "math"
    assert md.parse_spec(f"math:{maths}") == md.DataSpec(path=maths, source="math")
    assert md.parse_spec("tfds:gsm8k:test@/data/tfds") == md.DataSpec(tfds_name="gsm8k", split="test", data_dir="/data/tfds")
    assert md.parse_spec("math:tfds:my_math") == md.DataSpec(tfds_name="my_math", split="train", source="math")
    assert md.parse_spec({"tfds": "gsm8k", "split": "test"}) == md.DataSpec(tfds_name="gsm8k", split="test")
    assert md.load_dataset({"path": gsm, "source": "gsm8k"}) == md.load_gsm8k(gsm)
    with pytest.raises(md.MathDataError, match="gsm8k' prefix|'gsm8k:' or 'math:' prefix"):
        md.load_dataset(fx.write_jsonl(tmp_path, "other.jsonl", [{"text": "hello"}]))
    with pytest.raises(md.MathDataError, match="unknown keys"):
        md.parse_spec({"path": gsm, "shuffle": True})


def test_mixture_is_ordered_tagged_and_seeded(tmp_path):
    gsm = fx.write_gsm8k_jsonl(tmp_path)
    maths = fx.write_math_jsonl(tmp_path)
    mixed = md.load_mixture([maths, gsm])
    assert [e.source for e in mixed] == ["math"] * len(fx.MATH_RECORDS) + ["gsm8k"] * len(fx.GSM8K_RECORDS)
    assert [e.answer for e in mixed] == list(fx.MATH_GOLD) + list(fx.GSM8K_GOLD)
    shuffled = md.load_mixture([maths, gsm], seed=3)
    order = np.random.default_rng(3).permutation(len(mixed))
    assert shuffled == [mixed[i] for i in order]
    assert shuffled == md.load_mixture([maths, gsm], seed=3)
    assert md.load_mixture(maths) == md.load_math(maths)
    with pytest.raises(md.MathDataError, match="occurs more than once"):
        md.load_mixture([gsm, gsm])
    with pytest.raises(md.MathDataError, match="at least one"):
        md.load_mixture([])


def test_malformed_gsm8k_record_names_file_line_and_field(tmp_path):
    lines = [json.dumps(fx.GSM8K_RECORDS[0]), "", json.dumps({"question": "q?", "answer": "no final answer here"})]
    path = fx.write_jsonl(tmp_path, "gsm8k.jsonl", lines=lines)
    with pytest.raises(md.MathDataError) as err:
        md.load_gsm8k(path)
    assert str(err.value) == "gsm8k.jsonl:3: field 'answer' has no '#### ' final answer"


def test_missing_field_and_invalid_json_are_located(tmp_path):
    path = fx.write_jsonl(tmp_path, "math.jsonl", lines=[json.dumps(fx.MATH_RECORDS[0]), json.dumps({"problem": "p"})])
    with pytest.raises(md.MathDataError, match=r"^math\.jsonl:2: missing field 'solution'"):
        md.load_math(path)
    path = fx.write_jsonl(tmp_path, "broken.jsonl", lines=[json.dumps(fx.GSM8K_RECORDS[0]), '{"question": "q", '])
    with pytest.raises(md.MathDataError, match=r"^broken\.jsonl:2: invalid JSON"):
        md.load_gsm8k(path)
    no_box = dict(fx.MATH_RECORDS[0], solution="The answer is 3.")
    path = fx.write_parquet(tmp_path, "math.parquet", [fx.MATH_RECORDS[0], no_box])
    with pytest.raises(md.MathDataError, match=r"^math\.parquet:row 2: field 'solution' has no non-empty \\boxed"):
        md.load_math(path)
    unbalanced = dict(fx.MATH_RECORDS[0], solution="so $\\boxed{\\frac{1}{2}$")
    with pytest.raises(md.MathDataError, match="balanced braces"):
        md.load_math(fx.write_jsonl(tmp_path, "u.jsonl", [unbalanced]))
    with pytest.raises(md.MathDataError, match=r"^l\.jsonl:1: record must be a JSON object, got list"):
        md.load_math(fx.write_jsonl(tmp_path, "l.jsonl", lines=["[1, 2]"]))


def test_empty_missing_and_unknown_files_fail_naming_them(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(md.MathDataError, match="empty.jsonl' is empty"):
        md.load_gsm8k(str(empty))
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(md.MathDataError, match="blank.jsonl' holds no records"):
        md.load_gsm8k(str(blank))
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        md.load_dataset(str(tmp_path / "nowhere.jsonl"))
    csv = tmp_path / "data.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(md.MathDataError, match="data.csv.*unknown format"):
        md.load_dataset(str(csv))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{3}", "3"),
        ("\\boxed{1} then \\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
        ("\\boxed{\\{1, 2\\}} end", "\\{1, 2\\}"),
        ("\\boxed {  7 }", "7"),
        ("\\fbox{x}", "x"),
        ("\\boxed{2} and \\fbox{9}", "9"),
        ("no box", None),
        ("\\boxed{\\frac{1}{2}", None),
        ("\\boxedfoo{3}", None),
    ],
)
def test_last_boxed_content_cases(text, expected):
    assert md.last_boxed_content(text) == expected


BALANCED = st.recursive(
    st.text(alphabet="abc123+-^_ \\frac", max_size=6).map(lambda s: s.replace("\\", "")),
    lambda inner: st.lists(inner, min_size=1, max_size=3).map(lambda parts: "{" + "".join(parts) + "}"),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(content=st.lists(BALANCED, min_size=1, max_size=3).map("".join), prefix=st.text(alphabet="xyz =.$", max_size=8))
def test_last_boxed_content_recovers_any_balanced_argument(content, prefix):
    text = f"{prefix}\\boxed{{0}} then \\boxed{{{content}}}$."
    assert md.last_boxed_content(text) == content.strip()


@pytest.mark.parametrize(
    "answer, gold",
    [("x\n#### 72", "72"), ("#### 1,234,567", "1234567"), ("a #### 3\n#### 4.5", "4.5"), ("####  -2 ", "-2"), ("no mark", None), ("#### ", None)],
)
def test_gsm8k_gold_answer(answer, gold):
    assert md.gsm8k_gold_answer(answer) == gold


def test_thousands_separators_only_in_whole_numbers():
    assert md.strip_thousands_separators(" 12,345.5 ") == "12345.5"
    assert md.strip_thousands_separators("(1,2)") == "(1,2)"
    assert md.strip_thousands_separators("1,23") == "1,23"


def test_tfds_shaped_bytes_records_convert():
    gsm = {"question": b"How many?", "answer": b"2 + 2 = 4\n#### 4", "annotation": b"2 + 2 = 4\n", "short_answer": b"4"}
    example = md.record_to_example(gsm, None, "tfds gsm8k:train[0]", "gsm8k:train", 0)
    assert example == md.MathExample("How many?", "4", "2 + 2 = 4\n#### 4", "gsm8k", None, None, "gsm8k:gsm8k:train:0")
    short_only = dict(gsm, answer=b"2 + 2 = 4")
    assert md.record_to_example(short_only, "gsm8k", "w", "l", 1).answer == "4"
    maths = {"problem": np.array(b"Find $x$."), "solution": b"$x = \\boxed{\\dfrac{3}{4}}$", "level": b"Level 4", "type": b"Algebra"}
    example = md.record_to_example(maths, None, "w", "my_math:train", 5)
    assert (example.question, example.answer, example.level, example.subject) == ("Find $x$.", "\\dfrac{3}{4}", "Level 4", "Algebra")
    with pytest.raises(md.MathDataError, match="^tfds x:train\\[2\\]: field 'question' is not valid UTF-8"):
        md.record_to_example({"question": b"\xff", "answer": b"#### 1"}, "gsm8k", "tfds x:train[2]", "x", 2)


def test_tfds_missing_data_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="TFDS dataset 'gsm8k' is not prepared under data_dir"):
        md.load_dataset(f"tfds:gsm8k:train@{tmp_path / 'no_data'}")


def test_tfds_prepared_dataset_loads_end_to_end(tmp_path):
    import tensorflow_datasets as tfds

    class TinyGsm8kForMathData(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            features = tfds.features.FeaturesDict({k: tfds.features.Text() for k in ("question", "answer")})
            return tfds.core.DatasetInfo(builder=self, features=features)

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for index, record in enumerate(fx.GSM8K_RECORDS):
                yield index, record

    data_dir = str(tmp_path / "tfds")
    TinyGsm8kForMathData(data_dir=data_dir, file_format="array_record").download_and_prepare()
    name = TinyGsm8kForMathData.name
    examples = md.load_dataset(f"tfds:{name}:train@{data_dir}")
    assert sorted(e.answer for e in examples) == sorted(fx.GSM8K_GOLD)
    assert {e.source for e in examples} == {"gsm8k"}
    assert len({e.uid for e in examples}) == len(fx.GSM8K_RECORDS)
    assert os.path.isdir(os.path.join(data_dir, name))
