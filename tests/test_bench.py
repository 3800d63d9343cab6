"""python -m fastjax.bench: plumbing tested with stand-in ladders (the Results page runs the real ones)."""

import json
import subprocess
import sys

import pytest

from fastjax import bench
from fastjax.tools import timing
from fastjax.tools.timing import Timing


def fake_ladder(part):
    if part == "many":
        return fake_many()
    rungs = [Timing(f"{part} slow", [2e-3, 2.2e-3]), Timing(f"{part} fast", [1e-3, 1.1e-3])]
    out = {"rungs": rungs, "floor": Timing("floor", [1e-3, 1e-3]), "extra": {"n": 116}, "seconds": 0.5}
    if part == "resnet":
        out["dispatch_floor"] = Timing("empty", [5e-6, 5e-6])
    return out


def test_main_writes_json_with_stamp_and_every_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "measure_part", fake_ladder)
    out = tmp_path / "sub" / "bench.json"
    bench.main(["--out", str(out)])
    data = json.loads(out.read_text())
    assert set(data["parts"]) == {"pln", "resnet", "many"}  # the ladders and Part IV's races
    assert data["stamp"]["jax"] and data["stamp"]["device"]
    slow = data["parts"]["pln"]["rungs"][0]
    assert slow["name"] == "pln slow" and slow["median"] == pytest.approx(2.1e-3)
    assert data["parts"]["resnet"]["dispatch_floor"]["median"] == pytest.approx(5e-6)
    printed = capsys.readouterr().out
    assert "### pln" in printed and "| pln slow |" in printed and "2.1" in printed and str(out) in printed


def test_one_part(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "measure_part", fake_ladder)
    out = tmp_path / "b.json"
    bench.main(["--part", "resnet", "--out", str(out)])
    assert list(json.loads(out.read_text())["parts"]) == ["resnet"]


def test_unknown_part_is_refused():
    with pytest.raises(ValueError, match="part must be one of"):
        bench.measure_part("mlp")
    result = subprocess.run([sys.executable, "-m", "fastjax.bench", "--part", "mlp"], capture_output=True, text=True)
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_figures_are_saved_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "measure_part", fake_ladder)
    monkeypatch.setenv("FASTJAX_IMAGES", str(tmp_path / "images"))
    bench.main(["--out", str(tmp_path / "a.json")])
    assert not (tmp_path / "images").exists()
    bench.main(["--out", str(tmp_path / "b.json"), "--figures"])
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["ladder-pln.png", "ladder-resnet.png"]


def test_a_saved_part_loads_back_as_timings(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTJAX_MEASUREMENTS", str(tmp_path))
    ladder = fake_ladder("resnet")
    bench.save_part("resnet", ladder)
    result, stamp = bench.load_part("resnet")
    assert result["rungs"] == ladder["rungs"] and result["dispatch_floor"] == ladder["dispatch_floor"]
    assert result["extra"] == {"n": 116} and stamp["size"] == "quick"
    assert bench.load_part("pln") is None  # nothing saved for that part


def test_a_part_saved_at_another_size_is_not_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTJAX_MEASUREMENTS", str(tmp_path))
    bench.save_part("pln", fake_ladder("pln"))
    monkeypatch.setenv("FASTJAX_SIZE", "full")
    assert bench.load_part("pln") is None


def fake_torch_race():
    t = {"PyTorch eager": Timing("PyTorch eager", [4e-3, 4e-3]), "torch.compile": Timing("torch.compile", [3e-3, 3e-3]),
         "floor": Timing("floor", [2e-3, 2e-3])}
    return {"step": {"timings": t, "failed": {}}}


def test_the_resnet_part_carries_the_race_against_pytorch(tmp_path, monkeypatch, capsys):
    def with_race(part):
        out = fake_ladder(part)
        if part == "resnet":
            out["torch_race"] = fake_torch_race()
        return out

    monkeypatch.setattr(bench, "measure_part", with_race)
    monkeypatch.setenv("FASTJAX_IMAGES", str(tmp_path / "images"))
    bench.main(["--part", "resnet", "--out", str(tmp_path / "r.json"), "--figures"])
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["parts"]["resnet"]["torch_race"]["step"]["timings"]["torch.compile"]["median"] == pytest.approx(3e-3)
    printed = capsys.readouterr().out
    assert "against PyTorch" in printed and "| PyTorch eager |" in printed and "| torch.compile |" in printed
    assert (tmp_path / "images" / "ladder-resnet.png").is_file()


def test_pytorch_rows_sit_beside_the_rungs_with_their_own_floor():
    import matplotlib

    matplotlib.use("Agg")
    from fastjax.tools import plots

    rungs, race = fake_ladder("resnet"), fake_torch_race()["step"]["timings"]
    others = [race["PyTorch eager"], race["torch.compile"]]
    ax = plots.plot_ladder(rungs["rungs"], floor=rungs["floor"], others=others, others_floor=race["floor"]).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["resnet slow", "resnet fast", "PyTorch eager", "torch.compile"]
    assert [t.get_text().strip() for t in ax.texts] == ["2.10×", "1.05×", "2.00×", "1.50×"]  # PyTorch: × its run's floor
    with pytest.raises(ValueError, match="others_floor"):
        plots.plot_ladder(rungs["rungs"], others=others)


def test_the_race_is_skipped_with_a_message_without_torch(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    out = bench.torch_race()
    assert "torch is not installed" in out["skipped"] and "skipped" in capsys.readouterr().out


def fake_many():
    one = Timing("JAX, one program", [1.0, 1.0], load=0.0)
    other = Timing("pyPLNmodels collection", [5.0, 5.0], load=0.0, extra={"threads": "PyTorch 1 thread"})
    return {saved_as: {"timings": {other.name: other, one.name: one}, "one": one.name} for saved_as in bench.MANY}


def test_part_six_races_are_a_part_of_the_bench_with_their_own_tables(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "measure_part", fake_ladder)  # the races need torch: faked, so it runs on both legs
    monkeypatch.setenv("FASTJAX_IMAGES", str(tmp_path / "images"))
    bench.main(["--part", "many", "--out", str(tmp_path / "m.json"), "--figures"])
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["parts"]["many"]["many-sweep"]["timings"]["JAX, one program"]["median"] == pytest.approx(1.0)
    printed = capsys.readouterr().out
    assert all(f"### {what}" in printed for what in bench.MANY.values())
    assert "| pyPLNmodels collection | PyTorch 1 thread | 5 | 5 | 5 | 5 |" in printed  # 5 s, 5× the one program's time
    assert not (tmp_path / "images").exists()  # no ladder to draw for Part IV


def test_part_six_races_are_skipped_with_a_reason_without_torch(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert bench.measure_part("many") == {"skipped": capsys.readouterr().out.strip()}
    assert "not installed" in bench.summary({"stamp": timing.stamp(), "parts": {"many": bench.measure_part("many")}})


def test_each_part_six_page_uses_the_benchs_sizes(root):
    for saved_as in bench.MANY:
        page = next((root / "chapters" / "many").glob(f"*{saved_as.split('-')[1][:4]}*.md")).read_text()
        assert f'bench.many_settings("{saved_as}")' in page and f'bench.save_part("{saved_as}"' in page
