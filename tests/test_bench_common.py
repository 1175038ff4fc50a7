"""benchmarks/common.py: the machine facts recorded beside every benchmark figure."""

import json

from benchmarks.common import cpu_model, report


def test_cpu_model_reads_the_name_and_the_widest_vector_unit(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t\t: fpu sse avx fma avx2\n\n"
                    "processor\t: 1\nmodel name\t: Some CPU @ 2.0GHz\nflags\t\t: fpu sse avx fma avx2\n")
    assert cpu_model(str(path)) == {"cpu": "Some CPU @ 2.0GHz", "simd": "avx2"}
    path.write_text("model name : X\nflags : avx avx2 avx512f avx512bw\n")
    assert cpu_model(str(path))["simd"] == "avx512f"
    path.write_text("model name : Y\nflags : sse sse2\n")
    assert cpu_model(str(path))["simd"] == "none"
    assert cpu_model(str(tmp_path / "missing")) == {}


def test_report_prints_the_table_and_writes_the_json_it_returns(tmp_path, capsys):
    out = tmp_path / "result.json"
    result = report("unit", [{"name": "a", "seconds": 1.5}, {"name": "b", "seconds": 0.25}],
                    config={"repeats": 3}, summary={"speedup": 6.0}, out=str(out))
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["rows"] == [{"name": "a", "seconds": 1.5}, {"name": "b", "seconds": 0.25}]
    assert result["summary"] == {"speedup": 6.0} and result["config"] == {"repeats": 3}
    printed = capsys.readouterr().out
    assert printed.startswith("RESULT ") and "== unit ==" in printed and "speedup: 6" in printed
