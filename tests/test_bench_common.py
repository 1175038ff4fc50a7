"""benchmarks/common.py: the machine facts recorded beside every benchmark figure."""

from benchmarks.common import cpu_model


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
