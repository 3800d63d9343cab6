import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from fastjax.tools import plots  # noqa: E402
from fastjax.tools.timing import Timing  # noqa: E402


def ladder():
    return [Timing("eager", [10e-3, 11e-3, 12e-3]), Timing("jit", [1e-3, 1.1e-3, 1.2e-3]),
            Timing("scan", [0.5e-3, 0.52e-3, 0.55e-3])]


def test_ladder_draws_one_bar_per_rung_with_the_floor(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTJAX_IMAGES", str(tmp_path))
    floor = Timing("floor", [0.5e-3, 0.5e-3, 0.5e-3])
    fig = plots.plot_ladder(ladder(), floor=floor, dispatch_floor=Timing("empty", [5e-6] * 3), title="t")
    ax = fig.axes[0]
    assert len(ax.patches) == 3
    ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
    assert [name for _, name in ticks] == ["eager", "jit", "scan"]  # first rung on top
    labels = [t.get_text().strip() for t in ax.texts]
    assert labels == ["22.00×", "2.20×", "1.04×"]  # median / floor median
    assert len(ax.get_lines()) >= 2  # floor and dispatch floor
    assert ax.get_xscale() == "linear"  # 22× between slowest and fastest: under the 30× that switches to log
    assert plots.plot_ladder(ladder(), log=True).axes[0].get_xscale() == "log"
    assert list(tmp_path.iterdir()) == []  # plotting saves nothing


def test_save_figure_writes_into_the_images_folder_only(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTJAX_IMAGES", str(tmp_path))
    plots.save_figure(plots.plot_ladder(ladder()), "ladder")
    assert (tmp_path / "ladder.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="plain file name"):
        plots.save_figure(plots.plot_ladder(ladder()), "../escape.png")


def test_images_dir_defaults_to_repo_images(monkeypatch, root):
    monkeypatch.delenv("FASTJAX_IMAGES", raising=False)
    monkeypatch.chdir(root / "chapters")
    assert plots.images_dir() == root / "images"


def test_ladder_rejects_empty_and_bad_unit():
    with pytest.raises(ValueError, match="at least one"):
        plots.plot_ladder([])
    with pytest.raises(ValueError, match="unit"):
        plots.plot_ladder(ladder(), unit="min")


def test_sweep_one_line_per_series():
    fig = plots.plot_sweep([16, 32, 64], {"a": [1, 2, 3], "b": [2, 3, 4]}, "width", "seconds")
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2 and ax.get_xlabel() == "width"
    with pytest.raises(ValueError, match="has 2 points for 3"):
        plots.plot_sweep([1, 2, 3], {"a": [1, 2]}, "x", "y")
    with pytest.raises(ValueError, match="at least one"):
        plots.plot_sweep([1], {}, "x", "y")


def captions(fig):
    return " ".join(t.get_text() for t in fig.texts)


def test_ladder_caption_warns_about_busy_timings_only():
    quiet = plots.plot_ladder(ladder(), floor=Timing("floor", [0.5e-3] * 5, load=0.1), caption="stamp")
    assert captions(quiet) == "stamp" and not any(bar.get_hatch() for bar in quiet.axes[0].patches)
    rungs = ladder() + [Timing("nnx.jit", [2e-3] * 5, load=1.2)]
    busy = plots.plot_ladder(rungs, floor=Timing("floor", [0.5e-3] * 5), caption="stamp")
    text = captions(busy)
    assert "busy" in text and "nnx.jit: 1.2" in text and "eager" not in text
    assert text.endswith("stamp")  # the stamp stays
    assert [bool(bar.get_hatch()) for bar in busy.axes[0].patches] == [False, False, False, True]
    assert "busy" in captions(plots.plot_ladder(ladder(), dispatch_floor=Timing("empty", [5e-6] * 5, load=0.9)))


def test_sweep_takes_timings_and_warns_about_busy_points():
    fig = plots.plot_sweep([16, 32], {"a": [1.0, 2.0]}, "width", "s", caption="stamp")
    assert captions(fig) == "stamp"
    series = {"a": [Timing("x", [1e-3] * 5), Timing("x", [2e-3] * 5, load=1.1)], "b": [3e-3, 4e-3]}
    fig = plots.plot_sweep([16, 32], series, "width", "s", caption="stamp")
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == pytest.approx([1e-3, 2e-3])  # medians drawn
    text = captions(fig)
    assert "busy" in text and "a at 32" in text and "a at 16" not in text


def test_another_librarys_bar_is_labelled_with_its_ratio_only_when_the_race_was_sound():
    floor = Timing("floor", [1e-3] * 3, load=0.0)
    quiet = Timing("PyTorch", [3e-3] * 3, load=0.0)
    busy = Timing("PyTorch busy", [3e-3] * 3, load=1.8)
    fig = plots.plot_ladder([floor], floor=floor, others=[quiet, busy], others_floor=floor, title="t")
    labels = [t.get_text().strip() for t in fig.axes[0].texts]
    assert labels == ["1.00×", "3.00×", "not measured (busy)"]


def test_bars_one_bar_per_series_and_group_with_labels_above():
    fig = plots.plot_bars(["a", "b", "c"], {"x": [1.0, 2.0, 3.0], "y": [2.0, 1.0, 0.5]}, "ms", above=["1×", "2×", "6×"])
    ax = fig.axes[0]
    assert len(ax.patches) == 6
    assert [t.get_text() for t in ax.texts] == ["1×", "2×", "6×"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="2 values for 3 groups"):
        plots.plot_bars(["a", "b", "c"], {"x": [1.0, 2.0]}, "ms")
    with pytest.raises(ValueError, match="at least one series"):
        plots.plot_bars(["a"], {}, "ms")

