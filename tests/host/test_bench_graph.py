"""bench/bench_graph.py's smoke run on the CPU: our Z-Image graph through a real ComfyUI v0.3.75 server, every case the
GPU run reports (cold, a new prompt, the same prompt, cold after a restart, cold after `swiftdit prebuild`, which on
the CPU builds nothing and says so), each with its nodes' seconds."""
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_the_cases_run(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_graph
    assert bench_graph.main(["--smoke", "--side", "ours", "--prebuild", "--repeats", "2",
                             "--report", str(tmp_path / "graph.md")]) == 0
    report = (tmp_path / "graph.md").read_text()
    assert report.count("| 2 new prompt and seed |") == 1 and "case 2 new prompt and seed: the median of " in report
    for case in ("1 cold", "2 new prompt and seed", "3 same prompt, new seed", "4 cold after a restart",
                 "0 swiftdit prebuild", "5 cold after swiftdit prebuild"):
        assert f"| {case} |" in report, report
    assert "nothing built: not a GPU" in capsys.readouterr().out  # the prebuild's own lines, on the CPU
    assert sorted(p.name.rsplit("_", 1)[-1] for p in tmp_path.glob("server_*.log")) == ["first.log", "prebuilt.log",
                                                                                         "restart.log"]


def test_repeated_cases_give_their_median():
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_graph
    from graph_peers import timed_cases
    cases = timed_cases(["a", "b", "c", "d"], 3)
    assert [c[1] for c in cases] == ["a", "b", "c", "d", "d", "d", "d"] and len({c[2] for c in cases}) == 7
    rows = [{"graph": "g", "case": c, "seconds": t} for c, t in (("1", 9.0), ("2", 3.0), ("2", 1.0), ("2", 2.0))]
    assert bench_graph.merged(rows) == [rows[0], {"graph": "g", "case": "2", "seconds": 2.0, "runs": [3.0, 1.0, 2.0]}]
    with pytest.raises(ValueError, match="3 new prompts need 4 prompts"):
        timed_cases(["a", "b"], 3)
